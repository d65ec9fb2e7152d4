#!/bin/bash
# Oracle of rl360/csv-line-parser: writes the reference module.
set -e
mkdir -p /app
cat > /app/csvline.py <<'PY'
"""One line of CSV into its fields (RFC 4180 quoting, no line breaks inside fields)."""


def parse_line(line: str) -> list[str]:
    fields: list[str] = []
    i, n = 0, len(line)
    while True:
        if i < n and line[i] == '"':
            i += 1
            value = []
            while True:
                if i >= n:
                    raise ValueError("unterminated quoted field")
                ch = line[i]
                if ch == '"':
                    if i + 1 < n and line[i + 1] == '"':
                        value.append('"')
                        i += 2
                        continue
                    i += 1
                    break
                value.append(ch)
                i += 1
            fields.append("".join(value))
            if i < n and line[i] != ",":
                raise ValueError(f"unexpected {line[i]!r} after a quoted field")
        else:
            end = line.find(",", i)
            if end == -1:
                end = n
            fields.append(line[i:end])
            i = end
        if i >= n:
            return fields
        i += 1  # the comma
PY
