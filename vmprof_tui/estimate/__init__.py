"""The estimation stage: what a workload will cost elsewhere.

Papers 003 (a VM's resource-usage model under concurrent workloads) and 004 (predicting a
program's run time on a target VM from its counts here and the target's published cost of
one of each operation: :mod:`vmprof_tui.estimate.predict`).
"""
