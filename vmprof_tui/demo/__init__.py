"""Demo VMs: a small KVM VMM of our own running real guest programs with known ground truth."""
