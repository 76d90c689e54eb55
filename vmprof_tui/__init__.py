"""vmprof: profile a whole KVM host — host kernel, VMMs and every guest — from the host alone."""

__version__ = "0.1.0"
