"""The shared corpus of tests/data/bundles (make_corpus.py writes it): each case materialised as
a bundle folder, for tests/test_bundle_rules.py and scripts/gpu/bundle_campaign.py.

The C++ runner (optimizer/luminav-triton-aot/tests/test_bundle_corpus.cpp) applies the same
operations; a case's ``code`` and ``field`` are what every loader must refuse it with.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
from typing import Any, Dict, List

CORPUS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "bundles")
BASE = os.path.join(CORPUS, "base")


def load_cases() -> List[Dict[str, Any]]:
    with open(os.path.join(CORPUS, "cases.json")) as f:
        return json.load(f)["cases"]


def _pointer(doc: Any, path: str):
    parts = [p.replace("~1", "/").replace("~0", "~") for p in path.split("/")[1:]]
    parent = doc
    for p in parts[:-1]:
        parent = parent[int(p)] if isinstance(parent, list) else parent[p]
    last = parts[-1]
    return parent, (int(last) if isinstance(parent, list) else last)


def apply(ops: List[Dict[str, Any]], folder: str) -> None:
    """Applies a case's operations to the bundle in ``folder`` (a copy of base/)."""
    mpath = os.path.join(folder, "manifest.json")
    for op in ops:
        kind = op["op"]
        path = os.path.join(folder, op.get("file", ""))
        if kind == "json" or kind == "rehash":
            with open(mpath) as f:
                doc = json.load(f)
            if kind == "json":
                parent, key = _pointer(doc, op["path"])
                if op.get("remove"):
                    del parent[key]
                elif isinstance(parent, list) and key == len(parent):
                    parent.append(op["value"])
                else:
                    parent[key] = op["value"]
            else:
                with open(path, "rb") as f:
                    digest = hashlib.sha256(f.read()).hexdigest()
                for e in doc["kernels"]:
                    if op["file"] in (e.get("cubin"), e.get("hsaco")):
                        e["sha256"] = digest
            with open(mpath, "w") as f:
                json.dump(doc, f, indent=2)
        elif kind == "write":
            data = bytes.fromhex(op["hex"]) if "hex" in op else op["text"].encode("utf-8")
            with open(path, "wb") as f:
                f.write(data)
        elif kind == "patch":
            with open(path, "r+b") as f:
                f.seek(op["offset"])
                f.write(bytes.fromhex(op["hex"]))
        elif kind == "truncate":
            os.truncate(path, op["size"])
        elif kind == "copy":
            shutil.copyfile(os.path.join(folder, op["from"]), os.path.join(folder, op["to"]))
        elif kind == "remove":
            if os.path.isdir(path) and not os.path.islink(path):
                os.rmdir(path)
            else:
                os.unlink(path)
        elif kind == "mkfifo":
            os.mkfifo(path)
        elif kind == "mkdir":
            os.mkdir(path)
        elif kind == "symlink":
            os.symlink(op["target"], path)
        else:
            raise ValueError(f"unknown corpus operation {kind!r}")


def materialise(case: Dict[str, Any], folder: str) -> str:
    """A fresh copy of base/ at ``folder`` with ``case``'s operations applied; returns it."""
    shutil.copytree(BASE, folder)
    apply(case["ops"], folder)
    return folder
