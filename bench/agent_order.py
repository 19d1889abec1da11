#!/usr/bin/env python3
"""Start-up layout of the agent binary: which of its functions a start touches.

  agent_order.py pages BINARY PID...      text pages of BINARY mapped in each PID, one file offset a line
  agent_order.py symbols BINARY PAGES...  function symbols on those pages (lld's ordering file): the
                                          first list's by address, then the next list's not yet named, …
  agent_order.py coverage BINARY ORDER    how many of ORDER's names BINARY still has
  agent_order.py evict FILE               drop FILE's clean pages from the page cache

Used by agent-order.sh, which makes the page list mean "touched": with
readahead off and the file out of the page cache, a page is mapped only if
some process faulted on it (fault-around maps only pages already cached).
"""
import os
import struct
import subprocess
import sys

PAGE = 4096


def pages(binary, pids):
    for pid in pids:
        with open(f"/proc/{pid}/maps") as maps, open(f"/proc/{pid}/pagemap", "rb") as pm:
            for line in maps:
                f = line.split()
                if len(f) < 6 or f[5] != binary or "x" not in f[1]:
                    continue
                lo, hi = (int(x, 16) for x in f[0].split("-"))
                pm.seek(lo // PAGE * 8)
                entries = pm.read((hi - lo) // PAGE * 8)
                for i in range((hi - lo) // PAGE):
                    (e,) = struct.unpack_from("<Q", entries, i * 8)
                    if e >> 63:  # present
                        print(hex(int(f[2], 16) + i * PAGE))


def functions(binary):
    out = subprocess.run(["nm", "-S", "--defined-only", binary], capture_output=True, text=True, check=True)
    for line in out.stdout.splitlines():
        f = line.split()
        if len(f) == 4 and f[2] in "tTwW" and int(f[1], 16) > 0:
            yield int(f[0], 16), int(f[1], 16), f[3]


def symbols(binary, *page_files):
    # The text segment's file offset -> address shift.
    shift = None
    out = subprocess.run(["readelf", "-lW", binary], capture_output=True, text=True, check=True)
    for line in out.stdout.splitlines():
        f = line.split()
        if f and f[0] == "LOAD" and "E" in f[6:-1]:  # flags: R E
            shift = int(f[2], 16) - int(f[1], 16)
    if shift is None:
        sys.exit("no executable LOAD segment")
    fns = sorted(functions(binary))
    seen, size, all_pages = set(), 0, set()
    for page_file in page_files:
        touched = {(int(l, 16) + shift) // PAGE for l in open(page_file) if l.strip()}
        all_pages |= touched
        for addr, n, name in fns:
            if name not in seen and any(p in touched for p in range(addr // PAGE, (addr + n - 1) // PAGE + 1)):
                seen.add(name)
                size += n
                print(name)
    print(f"{len(seen)} functions, {size >> 10} KiB, on {len(all_pages)} touched pages "
          f"({len(all_pages) * PAGE >> 10} KiB)", file=sys.stderr)


def coverage(binary, order):
    have = {name for _, _, name in functions(binary)}
    want = [l.strip() for l in open(order) if l.strip()]
    print(f"{sum(n in have for n in want)} of {len(want)}")


def evict(path):
    fd = os.open(path, os.O_RDONLY)
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    os.close(fd)


if __name__ == "__main__":
    cmd, args = sys.argv[1], sys.argv[2:]
    {"pages": lambda: pages(args[0], args[1:]),
     "symbols": lambda: symbols(*args),
     "coverage": lambda: coverage(*args),
     "evict": lambda: evict(*args)}[cmd]()
