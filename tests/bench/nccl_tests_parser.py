"""A reader of nccl-tests' text output, as a user's script would write one.

It knows nccl-tests' format, not gradcomm-bench's code: the column names come from the
header comment line that holds "size" and "count"; a name that appears twice (time,
algbw, busbw, #wrong) is out-of-place the first time and in-place the second, as in
nccl-tests. Rows are the lines that are not comments. The closing lines are
"# Out of bounds values : N OK|FAILED" and "# Avg bus bandwidth    : X".

    parse(text) -> {"columns": [...], "rows": [{name: cell}], "out_of_bounds": int,
                    "out_of_bounds_status": str, "avg_busbw": float}
"""
import re


class ParseError(Exception):
    pass


def _header(lines):
    for line in lines:
        if not line.startswith("#"):
            continue
        words = line[1:].split()
        if "size" in words and "count" in words and "busbw" in words:
            names, seen = [], {}
            for w in words:
                seen[w] = seen.get(w, 0) + 1
                if seen[w] == 1:
                    names.append(w)
                elif seen[w] == 2:
                    names.append("in_place." + w)
                else:
                    raise ParseError(f"column {w!r} appears three times")
            # The first occurrence of a repeated name is the out-of-place one.
            repeated = {w for w, n in seen.items() if n == 2}
            return ["out_of_place." + n if n in repeated else n for n in names]
    raise ParseError("no header line with size/count/busbw")


def parse(text):
    lines = text.splitlines()
    columns = _header(lines)
    rows = []
    for line in lines:
        if not line.strip() or line.startswith("#"):
            continue
        cells = line.split()
        if len(cells) != len(columns):
            raise ParseError(f"row has {len(cells)} cells, header {len(columns)}: {line!r}")
        rows.append(dict(zip(columns, cells)))
    oob = avg = None
    for line in lines:
        m = re.match(r"^#\s*Out of bounds values\s*:\s*(\d+)\s+(OK|FAILED)\s*$", line)
        if m:
            oob = (int(m.group(1)), m.group(2))
        m = re.match(r"^#\s*Avg bus bandwidth\s*:\s*(\S+)\s*$", line)
        if m:
            avg = float(m.group(1))
    if oob is None:
        raise ParseError("no '# Out of bounds values' line")
    if avg is None:
        raise ParseError("no '# Avg bus bandwidth' line")
    return {"columns": columns, "rows": rows, "out_of_bounds": oob[0], "out_of_bounds_status": oob[1],
            "avg_busbw": avg}
