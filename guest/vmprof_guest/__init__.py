"""vmprof-guest: gathers, inside a Linux guest, what the host needs to name guest samples.

Standard library only (bcc is used when importable).  See docs/guest-agent.md.
"""

__version__ = "0.1.0"
