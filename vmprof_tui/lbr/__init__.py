"""The LBR wing: block times with measured CPI (Yamamoto et al. 2014; docs/lbr.md), from collection to the screen.

It rests on the core (collect → record → resolve → analyse → show) and the core does not import it, except its two
contracts on the ground floor: the LBR sample model and the record layout of bpf/lbr_record.h.  In the order data
flows through it:

- ``model``, ``records``: LbrSample, branch filters and fields; the BPF record as numpy reads it (ground floor)
- ``capability``, ``patterns``: can this host collect LBR; the paper's four collection patterns
- ``collector``: bpf/lbr.bpf.c on perf-event groups of hardware cycles and instructions (PMU hosts)
- ``groundtruth``, ``simulate``, ``simulated_collector``: ptrace single-stepping (exact truth); LBR records of a
  single-stepped command, as a recording (`record --lbr=simulate`) or as a collector the session polls (`top
  --lbr=simulate`)
- ``recording``, ``perf_script``, ``live``: LBR samples of a recording, of `perf record -b` text, of a live session
- ``disasm``, ``reconstruct``, ``blocks``: instruction blocks, their counts and times (the analysis)
- ``source``, ``screen``, ``format_*``: the block view of `vmprof top`; `vmprof blocks`' table, JSON and CSV
"""
