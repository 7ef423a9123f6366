"""aot/_worker.py: one process of a parallel bundle build (``python -m luminamoon.aot._worker``).

It reads a pickled list of work items from stdin, compiles each (builder._compile_in_worker)
and writes one pickled ``(index, entry, cubin)`` per item to stdout as soon as it is done, or
``(index, None, message)`` for an item that failed. It starts from a fresh interpreter, so it
holds no compiler state of the process that started it (a forked copy of a process that has
compiled a kernel deadlocks or dies in LLVM's thread pool on Triton 3.0/3.1), and it imports
nothing of that process's ``__main__``.
"""
import pickle
import sys


def main() -> int:
    from luminamoon.aot import builder

    items = pickle.load(sys.stdin.buffer)
    out = sys.stdout.buffer
    for item in items:
        try:
            result = builder._compile_in_worker(item)
        except Exception as exc:  # noqa: BLE001 - reported to the parent, which raises it
            result = (item[0], None, f"{type(exc).__name__}: {exc}")
        pickle.dump(result, out)
        out.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
