"""scripts/gpu/campaign_workers.py: the bundle campaign's crash-isolated workers (the driver
alone, the aot backend's first step: bundle_campaign.py --driver-worker / --aot-worker), the
lanes that feed them, and their results in words."""
from __future__ import annotations

import json
import os
import queue
import select
import subprocess
import sys
import threading
import time
from typing import Any, Dict, List, Optional, Tuple

from campaign_common import SHAPES, WORKER_EXITS, log

# The program every worker runs: bundle_campaign.py beside this file, with a worker's flag
SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "bundle_campaign.py")


# --------------------------------------------------------------------------------------------
# The driver alone: cuModuleLoadData of each mutated cubin, in crash-isolated workers
# --------------------------------------------------------------------------------------------
def result_stream():
    """A worker's result stream: the original stdout, moved to a descriptor of its own; fd 1
    (Python's and C libraries' prints) goes to stderr, so nothing else can write to it."""
    fd = os.dup(1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    return os.fdopen(fd, "w")


def driver_worker() -> int:
    """--driver-worker: reads "cubin path<TAB>entry" lines; writes one JSON line each."""
    import ctypes

    out = result_stream()
    try:
        cu = ctypes.CDLL("libcuda.so.1")
    except OSError as exc:
        out.write(json.dumps({"skip": f"no CUDA driver: {exc}"}) + "\n")
        out.flush()
        return 0
    vp = ctypes.c_void_p

    def name(rc: int) -> str:
        s = ctypes.c_char_p()
        if rc == 0:
            return "CUDA_SUCCESS"
        if cu.cuGetErrorName(rc, ctypes.byref(s)) == 0 and s.value:
            return s.value.decode()
        return f"CUresult {rc}"

    dev, ctx = ctypes.c_int(), vp()
    for rc in (cu.cuInit(0), cu.cuDeviceGet(ctypes.byref(dev), 0),
               cu.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev), cu.cuCtxSetCurrent(ctx)):
        if rc != 0:
            out.write(json.dumps({"skip": f"the CUDA driver did not start: {name(rc)}"}) + "\n")
            out.flush()
            return 0
    out.write(json.dumps({"ready": True}) + "\n")
    out.flush()
    for line in sys.stdin:
        path, entry = line.rstrip("\n").split("\t")
        with open(path, "rb") as f:
            data = f.read()
        buf = ctypes.create_string_buffer(data, len(data) + 1)  # NUL after: text is read as PTX
        mod = vp()
        rc = cu.cuModuleLoadData(ctypes.byref(mod), buf)
        res = {"load": name(rc)}
        if rc == 0:
            fn = vp()
            res["function"] = name(cu.cuModuleGetFunction(ctypes.byref(fn), mod, entry.encode()))
            res["unload"] = name(cu.cuModuleUnload(mod))
        res["sync"] = name(cu.cuCtxSynchronize())
        if _report(out, res, broken=res["sync"] != "CUDA_SUCCESS"):
            return WORKER_EXITS
    return 0



def _report(out, res: Dict[str, Any], broken: bool) -> bool:
    """Writes one mutant's result line; True when the worker must exit (a broken context: the
    parent starts a fresh worker)."""
    if broken:
        res["exits"] = WORKER_EXITS
    out.write(json.dumps(res) + "\n")
    out.flush()
    return bool(res.get("exits"))

def driver_verdict(res: Dict[str, Any]) -> str:
    if "worker" in res:
        return "not run: " + res["worker"]
    if "crash" in res or "hang" in res:
        return res.get("crash") or "hang"
    if res["load"] != "CUDA_SUCCESS":
        return res["load"]
    if res.get("function") != "CUDA_SUCCESS":
        return "loaded, " + res.get("function", "?")
    if res.get("sync") != "CUDA_SUCCESS":
        return "loaded, context " + res["sync"]
    return "loaded"


class Lanes:
    """``n`` worker processes of bundle_campaign.py (``flag``), each fed one line at a time; a
    worker that dies takes its item with it (a crash) and is replaced, one that stays silent past
    ``timeout`` is killed (a hang). A worker that ends on purpose after an item (its result says
    ``exits``: a sticky CUDA error broke its context) is waited for and replaced before the
    next item, so its exit is charged to no one. Each result of a worker that had run items
    before names the last of them (``after``): a crash, hang or sticky error can come from the
    state an earlier bundle left; :meth:`alone` runs items again, each in a fresh worker."""

    def __init__(self, flag: str, n: int, timeout: float, deadline: float,
                 env: Optional[Dict[str, str]] = None) -> None:
        self.flag, self.n, self.timeout, self.deadline = flag, n, timeout, deadline
        self.env = dict(os.environ, **(env or {}))
        self.starts = 0

    def start(self) -> Tuple[Optional[subprocess.Popen], Optional[str], Dict[str, Any]]:
        self.starts += 1
        p = subprocess.Popen([sys.executable, SCRIPT, self.flag],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                             env=self.env)
        first = self._read(p, max(self.deadline - time.monotonic(), 10.0))
        try:
            msg = json.loads(first or "")
        except ValueError:
            p.kill()
            return None, f"the worker did not start in time (rc {p.wait()})", {}
        if "skip" in msg:
            p.wait()
            return None, msg["skip"], msg
        return p, None, msg

    @staticmethod
    def _read(p: subprocess.Popen, timeout: float) -> Optional[str]:
        """One line, "" at the end of the stream, None on timeout."""
        r, _, _ = select.select([p.stdout], [], [], timeout)
        if not r:
            return None
        return p.stdout.readline()

    def alone(self, items: List[Tuple[str, str]]) -> Tuple[Dict[str, Dict[str, Any]],
                                                            Optional[str]]:
        """The same as :meth:`run`, each item in a worker of its own (started for it)."""
        return self.run(items, one_each=True)

    def run(self, items: List[Tuple[str, str]], first: Optional[Any] = None,
            one_each: bool = False) -> Tuple[Dict[str, Dict[str, Any]], Optional[str]]:
        """{id: result} for (id, line) items, or ({}, why) when the workers cannot start.
        ``first``: an already started (process, message) to use as lane 0; ``one_each``: a
        fresh worker for every item."""
        q: "queue.Queue[Tuple[str, str]]" = queue.Queue()
        for it in items:
            q.put(it)
        results: Dict[str, Dict[str, Any]] = {}
        whys: List[str] = []

        def lane(k: int) -> None:
            try:
                lane_items(k)
            except Exception as exc:  # noqa: BLE001 - one lane's failure is logged, not fatal
                log(f"{self.flag} lane {k}: {exc!r}")

        def close(p: subprocess.Popen) -> None:
            try:
                p.stdin.close()
            except BrokenPipeError:
                pass
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()

        def lane_items(k: int) -> None:
            p = None
            prev = None  # the item the current worker ran last
            if k == 0 and first is not None:
                p = first
            while time.monotonic() < self.deadline:
                try:
                    ident, line = q.get_nowait()
                except queue.Empty:
                    break
                if p is None or p.poll() is not None:
                    if p is not None:
                        p.wait()
                    p, why, _ = self.start()
                    prev = None
                    if p is None:  # no worker starts here (no driver, no device): stop
                        whys.append(why)
                        q.put((ident, line))
                        break
                try:
                    p.stdin.write(line + "\n")
                    p.stdin.flush()
                    out = self._read(p, self.timeout)
                except BrokenPipeError:
                    out = ""
                after = {"after": prev} if prev is not None else {}
                prev = ident
                if out is None:
                    p.kill()
                    p.wait()
                    results[ident] = {"hang": f"hang ({self.timeout:.0f} s)", **after}
                    p = None
                    continue
                if not out:
                    rc = p.wait()
                    results[ident] = {"crash": f"crash: signal {-rc}" if rc < 0 else
                                      f"crash: exit {rc}", **after}
                    p = None
                    continue
                try:
                    results[ident] = dict(json.loads(out), **after)
                except ValueError:
                    results[ident] = {"worker": f"bad output {out[:80]!r}", **after}
                    p.kill()
                if results[ident].get("exits"):
                    # it ends on purpose (a sticky error): wait for it, charged to no one
                    try:
                        p.wait(timeout=30)
                    except subprocess.TimeoutExpired:
                        p.kill()
                        p.wait()
                    p = None
                elif one_each:
                    close(p)
                    p = None
                elif p.poll() is not None:
                    p.wait()
                    p = None
            if p is not None:
                close(p)

        threads = [threading.Thread(target=lane, args=(k,)) for k in range(self.n)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        left = q.qsize()
        if left:
            log(f"{self.flag}: {left} items not run ("
                + (f"no worker: {whys[0]}" if whys else "the phase's time is up") + ")")
        if not results and whys:
            return {}, whys[0]
        return results, None


def aot_verdict(a: Dict[str, Any]) -> str:
    """One aot step's result in words: crash, hang, sticky (a sticky CUDA error), or its
    outcome and code."""
    if "crash" in a or "hang" in a:
        return a.get("crash") or a.get("hang")
    if "aot_sticky" in a:
        return "sticky: " + a["aot_sticky"][:120]
    if "worker" in a:
        return "not run: " + a["worker"]
    return a.get("aot_outcome", "?") + (f":{a['aot_code']}" if a.get("aot_code") else "")


def _reproduced(r: Dict[str, Any], what: Tuple[str, ...]) -> bool:
    """Whether the aot step's crash, hang or sticky error (``what``: verdict prefixes) is the
    bundle's own: it recurs alone in a fresh worker, or the worker had run nothing before it,
    or it could not be run alone (then it counts, unconfirmed)."""
    if not r.get("aot_after"):
        return True
    return r.get("aot_alone", "not run").startswith(what + ("not run",))


def cubins_touched(m: Dict[str, Any]) -> List[str]:
    """The cubin files whose bytes a mutation changes."""
    out: List[str] = []
    for op in m["ops"]:
        f = op.get("to") if op["op"] == "copy" else op.get("file")
        if op["op"] in ("patch", "truncate", "splice", "write", "copy") and f and \
                f.endswith(".cubin") and f not in out:
            out.append(f)
    return out


# --------------------------------------------------------------------------------------------
# The aot backend's first step (worker processes)
# --------------------------------------------------------------------------------------------
def aot_worker() -> int:
    """--aot-worker: reads bundle folders from stdin, one a line; writes one JSON line each.

    The reference is the base bundle's aot step ($CAMPAIGN_BASE), computed by the first worker
    (which also compares it with the triton backend's step, unless $CAMPAIGN_NO_TRITON) and
    saved to $CAMPAIGN_REFERENCE for the others."""
    out = result_stream()
    import torch

    if not torch.cuda.is_available():
        out.write(json.dumps({"skip": "no CUDA device"}) + "\n")
        out.flush()
        return 0
    from luminamoon.aot.rules import BundleError
    from luminamoon.optimizer import LuminaMoon

    gen = torch.Generator().manual_seed(0)
    init = [torch.randn(s, generator=gen) for s in SHAPES]
    grads = [torch.randn(s, generator=gen) for s in SHAPES]

    def step(backend: str, bundle: Optional[str]):
        """(parameters after one step, the exception it raised or None)."""
        params = [p.clone().cuda().requires_grad_() for p in init]
        error = None
        try:
            opt = LuminaMoon(params, lr=3e-2, seed=11, backend=backend, aot_bundle=bundle)
            for p, g in zip(params, grads):
                p.grad = g.cuda()
            opt.step()
        except Exception as exc:  # noqa: BLE001 - judged by the caller
            error = exc
        torch.cuda.synchronize()  # a launch fault surfaces here (and ends the worker)
        return [p.detach().cpu() for p in params], error

    ref_path = os.environ["CAMPAIGN_REFERENCE"]
    hello: Dict[str, Any] = {"ready": True}
    if os.path.exists(ref_path):
        reference = torch.load(ref_path)
        hello["reference"] = "loaded"
    else:
        reference, error = step("aot", os.environ["CAMPAIGN_BASE"])
        if error is not None:
            out.write(json.dumps({"skip": f"the base bundle's aot step failed: {error!r}"}) + "\n")
            out.flush()
            return 0
        hello["reference"] = "computed"
        hello["base_changed"] = not all(torch.equal(a, b) for a, b in zip(reference, init))
        if not os.environ.get("CAMPAIGN_NO_TRITON"):
            t0 = time.monotonic()
            tri, error = step("triton", None)
            hello["triton_equal"] = None if error is not None else \
                all(torch.equal(a, b) for a, b in zip(tri, reference))
            hello["triton_error"] = repr(error)[:200] if error is not None else ""
            hello["triton_s"] = round(time.monotonic() - t0, 1)
        torch.save(reference, ref_path + ".tmp")
        os.replace(ref_path + ".tmp", ref_path)
    out.write(json.dumps(hello) + "\n")
    out.flush()
    for line in sys.stdin:
        bundle = line.strip()
        if not bundle:
            continue
        res: Dict[str, Any] = {}
        try:
            params, error = step("aot", bundle)
        except Exception as exc:  # noqa: BLE001 - a sticky CUDA error: the context is gone
            res.update(aot_outcome="error", aot_code=type(exc).__name__,
                       aot_sticky=" ".join(str(exc).split())[:300] or repr(exc)[:300])
        else:
            if error is None:
                res["aot_outcome"] = "accepted"
                res["aot_same"] = all(torch.equal(a, b) for a, b in zip(params, reference))
            else:
                if isinstance(error, BundleError):
                    res.update(aot_outcome="refused", aot_code=error.code, aot_field=error.field)
                else:  # a driver error, another exception
                    res.update(aot_outcome="error", aot_code=type(error).__name__,
                               aot_field=str(error).splitlines()[0][:160] if str(error) else "")
                # nothing may have been launched: the parameters are untouched
                res["aot_untouched"] = all(torch.equal(a, b) for a, b in zip(params, init))
        if _report(out, res, broken="aot_sticky" in res):
            return WORKER_EXITS
    return 0
