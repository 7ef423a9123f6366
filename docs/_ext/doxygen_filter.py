"""Doxygen input filter: the public headers' plain comments become Doxygen comments.

A comment on a line of its own (``/* ...`` or ``// ...``) documents the declaration below it; a
comment after code on the same line documents that member (``/**<``, ``///<``). The headers keep
their plain style; only what Doxygen reads changes. Usage (docs/Doxyfile): python3 this FILE.
"""
import re
import sys

LEADING_BLOCK = re.compile(r"^(\s*)/\*(?![*/])")
LEADING_LINE = re.compile(r"^(\s*)//(?!/)")
TRAILING_BLOCK = re.compile(r"^(\s*\S.*?)/\*(?![*<])(.*)$")
TRAILING_LINE = re.compile(r"^(\s*[^/\s].*?)//(?![/<])(.*)$")


def convert(line: str) -> str:
    if line.lstrip().startswith(("//", "/*", "*")):
        # '#word' in a comment is a link request to Doxygen: these are plain text
        line = re.sub(r"(?<!\\)#(?=[A-Za-z_])", r"\\#", line)
    if LEADING_BLOCK.match(line):
        return LEADING_BLOCK.sub(r"\1/**", line, count=1)
    if LEADING_LINE.match(line):
        return LEADING_LINE.sub(r"\1///", line, count=1)
    if '"' not in line:
        if TRAILING_BLOCK.match(line):
            return TRAILING_BLOCK.sub(r"\1/**<\2", line, count=1)
        if TRAILING_LINE.match(line):
            return TRAILING_LINE.sub(r"\1///<\2", line, count=1)
    return line


def main(path: str) -> None:
    with open(path, encoding="utf-8") as f:
        for line in f:
            sys.stdout.write(convert(line))


if __name__ == "__main__":
    main(sys.argv[1])
