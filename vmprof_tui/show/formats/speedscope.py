"""speedscope's own file format (https://www.speedscope.app/file-format-schema.json): one "sampled" profile
per report profile (per VM at the guest level without --vm), its samples the stacks of `show.stacks` weighted
by their time (whole samples × the sampling period, in nanoseconds).  Frames are shared between profiles;
``file`` is the frame's module.
"""

from __future__ import annotations

import json

from vmprof_tui import __version__
from vmprof_tui.show.formats import ReportInput
from vmprof_tui.show.stacks import Frame, stacks

ONE_PROFILE = False
SCHEMA = "https://www.speedscope.app/file-format-schema.json"


def render(inp: ReportInput) -> str:
    an = inp.analysis
    frames: dict[Frame, int] = {}
    profiles = []
    for profile, sts in stacks(an, inp.profiles, inp.cpu, inp.limit):
        samples, weights = [], []
        for st in sts:
            n = int(round(st.samples))
            if n <= 0:
                continue
            samples.append([frames.setdefault(f, len(frames)) for f in st.frames])
            weights.append(int(round(n * an.period_ns)))
        name = "host" if profile.level == "host" else f"guest {profile.vm}"
        if profile.vcpu is not None:
            name += f" vcpu{profile.vcpu}"
        profiles.append({"type": "sampled", "name": name, "unit": "nanoseconds", "startValue": 0,
                         "endValue": sum(weights), "samples": samples, "weights": weights})
    doc = {"$schema": SCHEMA, "name": f"vmprof {an.rec.path.name}", "exporter": f"vmprof {__version__}",
           "activeProfileIndex": 0, "profiles": profiles,
           "shared": {"frames": [{"name": f.name, "file": f.module} if f.module else {"name": f.name}
                                 for f in frames]}}
    return json.dumps(doc, separators=(",", ":")) + "\n"
