"""aot/manifest_json.py: the manifest's JSON profile (the rule book's rules J1-J5): integers
only and within int64, no key twice in an object, no byte-order mark, valid UTF-8 with no lone
surrogates, bounded nesting. parse_manifest_bytes is public in aot/manifest.py."""
from __future__ import annotations

import json
from typing import Any, Dict, List, Tuple

from .rules import JSON_MAX_DEPTH, BundleError

INT64_MIN, INT64_MAX = -(1 << 63), (1 << 63) - 1


# --------------------------------------------------------------------------------------------
# The JSON profile (rule J)
# --------------------------------------------------------------------------------------------
class _JsonRefusal(Exception):
    pass


def _json_int(text: str) -> int:
    if len(text) > 20:
        raise _JsonRefusal(f"the number {text[:24]}... is outside the int64 range")
    v = int(text)
    if not INT64_MIN <= v <= INT64_MAX:
        raise _JsonRefusal(f"the number {text} is outside the int64 range")
    return v


def _json_float(text: str) -> float:
    raise _JsonRefusal(f"the number {text[:24]} is not an integer (the manifest holds integers "
                       "only)")


def _json_constant(text: str) -> float:
    raise _JsonRefusal(f"{text} is not JSON")


def _json_object(pairs: List[Tuple[str, Any]]) -> Dict[str, Any]:
    out: Dict[str, Any] = {}
    for k, v in pairs:
        if k in out:
            raise _JsonRefusal(f"the key {json.dumps(k)} twice in one object")
        out[k] = v
    return out


def _check_tree(doc: Any) -> None:
    """Depth (rule J4) and lone surrogates (J2) over the parsed tree, without recursion."""
    stack = [(doc, 1)]
    while stack:
        v, depth = stack.pop()
        if isinstance(v, (dict, list)):
            if depth > JSON_MAX_DEPTH:
                raise _JsonRefusal(f"nesting deeper than {JSON_MAX_DEPTH}")
            items = v.items() if isinstance(v, dict) else ((None, x) for x in v)
            for k, x in items:
                if k is not None:
                    k.encode("utf-8")
                stack.append((x, depth + 1))
        elif isinstance(v, str):
            v.encode("utf-8")


def parse_manifest_bytes(raw: bytes, path: str = "manifest.json") -> Any:
    """The manifest's JSON, read by the rule book's profile (rules J1-J5), or
    ``BundleError(bad_json)``."""
    def refuse(why: str) -> BundleError:
        return BundleError("bad_json", path, "(file)", "valid UTF-8 JSON of the manifest profile",
                           why, "rebuild the bundle (luminamoon aot build)")

    if raw.startswith(b"\xef\xbb\xbf"):
        raise refuse("a UTF-8 byte-order mark")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise refuse(f"invalid UTF-8 at byte {exc.start}") from None
    try:
        doc = json.loads(text, object_pairs_hook=_json_object, parse_int=_json_int,
                         parse_float=_json_float, parse_constant=_json_constant)
        _check_tree(doc)
    except _JsonRefusal as exc:
        raise refuse(str(exc)) from None
    except RecursionError:
        raise refuse(f"nesting deeper than {JSON_MAX_DEPTH}") from None
    except UnicodeEncodeError:
        raise refuse("a lone surrogate (\\ud800-\\udfff) in a string") from None
    except json.JSONDecodeError as exc:
        raise refuse(f"unparsable text ({exc})") from None
    return doc
