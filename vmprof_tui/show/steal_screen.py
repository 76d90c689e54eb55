"""A VM's steal detail: by cause and by who held the pCPU, by exit reason, co-stop and halt polling."""

from __future__ import annotations

from vmprof_tui.analyse.source import ProfileSource
from vmprof_tui.show.screen import VmTableScreen


class StealScreen(VmTableScreen):
    view = "steal"
    columns = ("vCPU", "kind", "cause", "seconds", "% of wall")
    default_sort = "seconds"
    detail = True  # each new chunk analysed in full once (window.poll)

    def prepare(self, an: ProfileSource) -> None:
        an.vcpu_steal(self.vm)  # each chunk's steal detail, computed once (WindowView.vcpu_steal)

    def title_text(self, an: ProfileSource) -> str:
        return (f"VM {self.vm}: steal by cause and by who held the pCPU (type 1), by exit reason (type 2); "
                "co-stop and halt polling")

    def vm_rows(self, an: ProfileSource) -> list[tuple[str, tuple]]:
        out = []
        for v in an.vcpu_steal(self.vm):
            wall = v["wall_s"] or 1.0
            for cause, sec in v["type1_by_cause_s"].items():
                if sec:
                    out.append((f"{v['vcpu']}:cause:{cause}", (f"vcpu{v['vcpu']}", "type 1 cause", cause, sec,
                                                                100 * sec / wall)))
            for who, sec in v["type1_by_holder_s"].items():
                out.append((f"{v['vcpu']}:{who}", (f"vcpu{v['vcpu']}", "type 1", who, sec, 100 * sec / wall)))
            for what, sec in (("co-stop", v["skew_s"]), ("halt polling", v["halt_poll_s"])):
                if sec:
                    out.append((f"{v['vcpu']}:{what}", (f"vcpu{v['vcpu']}", "of which", what, sec, 100 * sec / wall)))
            for why, sec in v["type2_by_exit_s"].items():
                out.append((f"{v['vcpu']}:{why}", (f"vcpu{v['vcpu']}", "type 2", why, sec, 100 * sec / wall)))
            out.append((f"{v['vcpu']}:idle", (f"vcpu{v['vcpu']}", "idle", "halt", v["idle_s"],
                                              100 * v["idle_s"] / wall)))
        return out
