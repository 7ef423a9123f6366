"""scripts/gpu/campaign_report.py: the bundle campaign's record: the versions it ran with, its
summary (the verdict) and the summary's text (bundle_campaign_summary.md)."""
from __future__ import annotations

import platform
import subprocess
from collections import Counter
from typing import Any, Dict, List

from campaign_workers import _reproduced


# --------------------------------------------------------------------------------------------
# The record
# --------------------------------------------------------------------------------------------
def versions() -> Dict[str, str]:
    v = {"python": platform.python_version(), "host": platform.node()}
    for mod in ("torch", "triton"):
        try:
            v[mod] = __import__(mod).__version__
        except Exception:  # noqa: BLE001
            pass
    try:
        p = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version",
                            "--format=csv,noheader"], capture_output=True, text=True, timeout=30)
        v["device"], v["driver"] = [x.strip() for x in p.stdout.splitlines()[0].split(",")][:2]
    except (OSError, IndexError, ValueError, subprocess.SubprocessError):
        v["device"] = "no GPU (nvidia-smi)"
    return v


def _drv_class(v: str) -> str:
    if not v:
        return ""
    if v.startswith(("crash", "hang")):
        return v.split(":")[0].split(" ")[0]
    return "loaded" if v == "loaded" else "error"


def summarise(rows: List[Dict[str, Any]], meta: Dict[str, Any]) -> Dict[str, Any]:
    s: Dict[str, Any] = dict(meta)
    ran = [r for r in rows if r.get("ran")]
    mut = [r for r in rows if r["family"] != "corpus"]
    s["bundles"] = len(rows)
    s["mutants"] = len(mut)
    s["corpus_cases"] = len(rows) - len(mut)
    s["not_run"] = len(rows) - len(ran)
    s["by_family"] = dict(Counter(r["family"] for r in rows))
    s["loader_cpp_by_code"] = dict(Counter(r["cpp_code"] or "accepted" for r in ran).most_common())
    s["loader_python_by_code"] = dict(Counter(r["py_code"] or "accepted"
                                              for r in ran).most_common())
    mran = [r for r in ran if r["family"] != "corpus"]
    s["mutants_refused_on_cpu"] = sum(1 for r in mran if not r["cpp_cpu_ok"])
    s["mutants_accepted_on_cpu"] = sum(1 for r in mran if r["cpp_cpu_ok"])
    # what reached the driver through the loader (luminav verify --require-gpu)
    reached = [r for r in ran if r.get("gpu")]
    s["reached_driver_via_loader"] = len(reached)
    s["driver_via_loader"] = dict(Counter(
        r["gpu"] if not r["gpu"].startswith("loaded") else "loaded" for r in reached).most_common())
    # the driver alone, beside the loader's verdict
    probed = [r for r in rows if r.get("drv")]
    s["driver_probe"] = {
        "bundles_probed": len(probed),
        "control": meta.get("driver_control", ""),
        "by_verdict": dict(Counter(r["drv"] for r in probed).most_common()),
        "loader_vs_driver": dict(Counter(
            f"{'accepted' if r.get('cpp_cpu_ok') else 'refused'} by the loader, "
            f"{_drv_class(r['drv'])} in the driver" for r in probed if r.get("ran")).most_common()),
    }
    s["driver_crashes_spared"] = [r["id"] for r in probed if r.get("ran") and not r["cpp_cpu_ok"]
                                  and _drv_class(r["drv"]) in ("crash", "hang")]
    s["driver_crashes_accepted"] = [r["id"] for r in probed if r.get("ran") and r["cpp_cpu_ok"]
                                    and _drv_class(r["drv"]) in ("crash", "hang")]
    s["aot_steps"] = sum(1 for r in rows if r.get("aot_outcome") not in (None, "", "skipped"))
    s["aot_by_outcome"] = dict(Counter(
        (r.get("aot_outcome") or "skipped") + (f":{r['aot_code']}" if r.get("aot_code") else "")
        for r in rows if r["family"] != "corpus").most_common())
    # an aot step's crash, hang or sticky error counts only where it recurs alone in a fresh
    # worker; the others are listed with the bundle the worker had run before
    s["crashes"] = [r["id"] for r in ran
                    if (isinstance(r["cpp_rc"], int) and r["cpp_rc"] < 0)
                    or (r.get("aot_outcome") == "crash" and _reproduced(r, ("crash",)))]
    s["hangs"] = [r["id"] for r in ran if r["cpp_rc"] == "timeout" or r["py_code"] == "timeout"
                  or (r.get("aot_outcome") == "hang" and _reproduced(r, ("hang",)))]
    s["aot_sticky"] = {r["id"]: r["aot_sticky"] for r in ran if r.get("aot_sticky")
                       and _reproduced(r, ("sticky",))}
    s["aot_not_alone"] = {r["id"]: {"was": r["aot_sticky"] and "sticky" or r["aot_code"],
                                    "after": r["aot_after"], "alone": r.get("aot_alone", "")}
                          for r in ran if (r.get("aot_outcome") in ("crash", "hang")
                                           or r.get("aot_sticky"))
                          and r["id"] not in s["crashes"] + s["hangs"]
                          and r["id"] not in s["aot_sticky"]}
    s["python_escapes"] = [r["id"] for r in ran if r["py_code"].startswith("escaped:")]
    s["disagreements"] = [r["id"] for r in ran if r["disagree"]]
    s["device_only_refusals"] = sum(1 for r in ran if r["cpp_code"] == "device")
    s["bad_launches"] = [r["id"] for r in rows if r.get("bad_launch")]
    s["corpus_unexpected"] = [r["id"] for r in ran if r.get("expected_ok") is False]
    s["ok"] = not (s["crashes"] or s["hangs"] or s["aot_sticky"] or s["python_escapes"]
                   or s["disagreements"]
                   or s["bad_launches"] or s["corpus_unexpected"] or s["driver_crashes_accepted"]
                   or (meta["require_gpu"] and meta.get("aot_skipped")))
    return s


def write_summary(path: str, s: Dict[str, Any]) -> None:
    def table(d: Dict[str, Any]) -> str:
        return "\n".join(f"| {k} | {v} |" for k, v in d.items()) or "| - | - |"

    dp = s["driver_probe"]
    lines = [
        f"# Bundle mutation campaign, {s['date']}",
        "",
        f"{s['device']} (driver {s.get('driver', '-')}) on {s['host']}; torch "
        f"{s.get('torch', '-')}, Triton {s.get('triton', '-')}, Python {s['python']}; luminav "
        f"verify{' --require-gpu' if s['require_gpu'] else ' (no --require-gpu)'}; seed "
        f"{s['seed']}; {s['elapsed_s']} s ({s['phases']}).",
        "",
        f"- mutants: {s['mutants']} of the base bundle {', '.join(s['base_keys'])} (sm_"
        f"{s['base_arch']}), plus {s['corpus_cases']} corpus cases; not run (time): "
        f"{s['not_run']}",
        f"- refused by the loader (C++, before the driver): {s['mutants_refused_on_cpu']} "
        f"mutants; accepted: {s['mutants_accepted_on_cpu']}",
        f"- reached the driver through the loader (luminav verify): "
        f"{s['reached_driver_via_loader']}: {s['driver_via_loader']}",
        f"- the driver alone on the mutated cubins of {dp['bundles_probed']} bundles (control, "
        f"the base's: {dp['control']}): {dp['loader_vs_driver']}",
        f"- driver crashes or hangs the loader spared: {len(s['driver_crashes_spared'])}; on "
        f"cubins the loader accepts: {len(s['driver_crashes_accepted'])} "
        f"{s['driver_crashes_accepted'][:20]}",
        f"- aot first steps: {s['aot_steps']}" + (f" (skipped: {s['aot_skipped']})"
                                                  if s.get("aot_skipped") else "")
        + f"; base step equals the triton backend's: {s.get('triton_equal', '-')}",
        f"- crashes: {len(s['crashes'])} {s['crashes'][:20]}; hangs: {len(s['hangs'])}; "
        f"Python exceptions other than BundleError: {len(s['python_escapes'])}",
        f"- sticky CUDA errors in a bundle's own aot step (a launch that broke the context; "
        f"the loader should have refused it): {len(s['aot_sticky'])} "
        f"{dict(list(s['aot_sticky'].items())[:10])}",
        f"- crashes, hangs or sticky errors that did not recur alone in a fresh worker (the "
        f"bundle run before them in the worker: `after`): {len(s['aot_not_alone'])} "
        f"{dict(list(s['aot_not_alone'].items())[:10])}",
        f"- C++/Python disagreements: {len(s['disagreements'])} {s['disagreements'][:20]}; "
        f"refusals only a device makes (`device`): {s['device_only_refusals']}",
        f"- launches of a refused bundle or results other than the base's: "
        f"{len(s['bad_launches'])} {s['bad_launches'][:20]}",
        f"- corpus cases not refused with their expected code: {len(s['corpus_unexpected'])} "
        f"{s['corpus_unexpected'][:20]}",
        f"- verdict: {'OK' if s['ok'] else 'FAILED'}",
        "",
        "| family | bundles |", "|---|---|", table(s["by_family"]), "",
        "| C++ loader (`luminav verify`) | bundles |", "|---|---|",
        table(s["loader_cpp_by_code"]), "",
        "| Python loader (`load_bundle`) | bundles |", "|---|---|",
        table(s["loader_python_by_code"]), "",
        "| the driver alone (cuModuleLoadData) | cubins |", "|---|---|",
        table(dp["by_verdict"]), "",
        "| aot first step | bundles |", "|---|---|", table(s["aot_by_outcome"]), "",
    ]
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")
