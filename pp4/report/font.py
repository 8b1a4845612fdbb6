"""The PNG timeline's letters: DejaVu Sans Mono's printable ASCII (Bitstream Vera licence: free to
use, copy and modify, as a font's glyphs), rasterized at 11 px into cells of 7 x 13 pixels (the
baseline at row 10), each pixel's coverage in 16 levels. A font of pixels here, rather than a font
library, since pp4 needs none otherwise: the SVG beside the PNG names the same monospace font, so
one layout serves both. Rows 0-12 of a glyph, 7 pixels each; DATA regenerates with

    python -m pp4.report.font /usr/share/fonts/truetype/dejavu/DejaVuSansMono.ttf
"""

from __future__ import annotations

import base64
import functools
import struct
import sys
import zlib

WIDTH, HEIGHT, BASELINE, PX = 7, 13, 10, 11
FIRST, LAST = 32, 126
DATA = (
    "eNqtWH9sU9cV/u774V/Pdl7bLOIPkjy2oLE2Tsy0aUWJLRdF1Vac1n90U5eE6iFVGiGgWZM6QrdI1ijDiIZ5XaehdjCLrWMU"
    "qhoKZW3i8BCFrSRoxkkENNFqpyC1otsS1j+mVd3bec/55ffskk67knV87eN7z/vOd8/5roH/YfA5ILRkNKAOYEFzZnc+paGt"
    "2TQrGMLzGex5Qhi5cq12YkL51gMYuTKF8y9gtdfmqgAuYPu06l8FXEqBOzwB7M7xrgBOTEeM7xBZ5s79QcaRJyCtTcj3v5C8"
    "p3dn8KtSVxCZ78A5KpevTI8iTqVwmjZIAK8GsTVUty3S9+w+ZNnw0Di+aA2Fo2drLpm7jXsBdwyMoOuldypwBvCQ6aef04ce"
    "CnntojNB6qHXI/S2CHgjprdhaLap5KwuB4S5GX71ZowdjuH5X6pw3j2c+2jbDPAAXLp+h4w5q1sxE9pkiAUgCTjk6l6r9oAl"
    "Y5+TZPR8jtlKXzgpJ3kTPp8CMQ1cMJ2liMlESxqnz2PcnQgjKlz4bS66IcQXBM0XPIjNYzJ468qD/wRfT3iP09LLjUv/1Jpw"
    "BfVj55nioVj2AfQjSQVN3Anwup62eBNfbo8RXQ/CcDhxEnyU0tbNZFc6PJw3FrMM1yz414BTs9jZiGY265w6dxKM0GisgMd7"
    "epCAwGQE0q8JF3fKWJqCCWdpo/KsrAc/fREXgUCtIkwfiD0m9/AFPudX+rA5G7QBIug6seH3QIMMJz3U2+YJd8fBZqxBENau"
    "qXE250w3yLvQOSx7nzoqaHwuLPfgUDZi8KycdYPDcoucFDOiFsIAjr+Uw9eMJKqebBqcvCJOVGXIfPQU+/eXytBJ4MnSgd5S"
    "yZsbULquyQfoaG6nM8YfIkTv+Sx6/kzXjbT1DQ0pdyHyfmL+huvk9Rvly+9GBraAVTyGgyMKZzDEq0JKQCAqf7NUVPsqLfrg"
    "Frz4sPZd7sFHmv48qZ1y9UjK00e6B7+d+Poaz0/uhXh8eelz3QEuxxHYBEeqiDOeWKP+bzHDFY7CF7Gt3Doyzs06Mq3o5j4Z"
    "CbZ27OdmMdeKMKd/GrOfguaxtBRnbA4IE2pUChopd2ehcGOXYauTj/49Lmir1Sh6iBqFKMKCJmpRdknQr1V4xH/omp9QI6r5"
    "R8/iVoeyMNP/Y3eWdN2ojRKFmB2KS89uXJidsTckGaHhhD/CCTkTXEemnWJpwU2uwE/dMA5J+YgiZDDZMLeHc50dOxZmmtEA"
    "7VEn0Enko6/KjF//V4VnpJqLhcdaMOu5OfH2dXscgibko0JeuJDHox9CuPk+ouJVQZMSFLw9jUZmJyqZ94w9rfVmznnnOTW7"
    "bv+G/N5jneueLuT38r51ceT3GjXWOh6LERIEwamQcHF3LuojJJK5KPc3iiVn5/WOrNKg7BNyQq4HraLGzXaik824Uo6pvEnv"
    "suG/MokZoeBXapSZVTn/6JFlyHzOpTcHyyEMnzvJ5zypEH7ET2yOhZ9L8zlJDaGTknjJsnQtMJCNtcickWDpRgz8AJWNEFNE"
    "rWX0Jjhr1Od0XbVooiVjF08ClbxouWFFR9o5NW4HJAl/E/HMT0X1ZSni+HkR9VT2LlNvt2fRAKr/bbh7H8+c3jkY+MJLPyy0"
    "vX6CfeBL+2Jn7d4hKsAHJZVdy8BBi72qoicg1wd3uVNs3M6QNJupp77ZHZCRVS30to1GozhSx+BIp1C32UYNRzZOI6frH1tc"
    "m6hxvAHspS3ilcwvqA4u0zhop9fpUnH3ElhdMMWAI2WqAUNFLbWkDhmrZkqf5yuYWiJJsqzTHI5gW0jZZKia/8cQOjo2GvYr"
    "9NpaUnMrH0TvoazCSOZ0D6cDSpegedLesVcsHZ3Os59MIQg/6dJbYsYvN6DICv5YN25X6OiLZXs05YmzhcN1FDI39qa1XjPF"
    "EFlcXco1/Q5X9KS60StmHKkW+RgGR1OVuyPtR0KiQWkXrycLPR0drAhZnHrHWswo6YE9hnaT/vpHU8JRGpeZimMNjG1pdyMI"
    "ioUVpZRj+hjpwbgrmUfTQ4uAEELFNfAffx83nSm/3IWimJ439nBZwXz3YzINpVnJSH95yxrB+hLlKMaRoKk6vVazT4Pw0EKT"
    "MWhKohSnPQmpK4FsEVI/XSq8MSnSUl5UWTKIWpJZLiL6T8sM8ZmNqZUBURTH9Ki2NeCr+4F2/nvN3nkjV4NvJYCU11b5mflW"
    "x4rOdMV6PX9LqSHyfSxmauQWzHGFmkg3PskGawhdkmdCuTPRZscoicQXeU1MR9HFim6qfJfBrS3ln5VBw8nswytKY4wZ4ncp"
    "P1XOmxF10MjG4G7gG7cgu+LeobxlSWPsNu9ObR+9YV6hfle6SVEChCm16oFcwswweSPqV6oq1U0I4Koz4VYvoD0A3IibGqzK"
    "8Mnof/k+z8N7ClfbDvbg3faEFJ+s6l2v7EI0KuOAAmkSziN5/qpQ9d4paKzoC/ai3xtk4xo8f6LuLRtnzEUlfqPV2z1E8ieg"
    "YHUEnrip+D8ailuLB/3qAzq+pesqVeNDJLKeKc3oQzrwcC5qLqYu3os/y5TumzzloC9lyno+U/ovYTiGhqB5rWujGp+G+/Uq"
    "z/klYHt2/xo0VRDj/wUwmpAh"
)


@functools.lru_cache(maxsize=1)
def _levels() -> bytes:
    packed = zlib.decompress(base64.b64decode(DATA))
    return bytes(v for b in packed for v in (b >> 4, b & 15))


def glyph(ch: str) -> bytes:
    """HEIGHT rows of WIDTH coverages (0-15); a character outside ASCII draws as '?'."""
    c = ord(ch) if FIRST <= ord(ch) <= LAST else ord("?")
    size = WIDTH * HEIGHT
    return _levels()[(c - FIRST) * size:(c - FIRST + 1) * size]
def tables(data):
    n = struct.unpack(">H", data[4:6])[0]
    out = {}
    for i in range(n):
        tag, _, off, ln = struct.unpack(">4sIII", data[12 + 16 * i:28 + 16 * i])
        out[tag.decode()] = data[off:off + ln]
    return out

def cmap4(t):
    n = struct.unpack(">H", t[2:4])[0]
    for i in range(n):
        pid, eid, off = struct.unpack(">HHI", t[4 + 8 * i:12 + 8 * i])
        if struct.unpack(">H", t[off:off + 2])[0] == 4 and pid in (0, 3):
            sub = t[off:]
            segx2 = struct.unpack(">H", sub[6:8])[0]
            seg = segx2 // 2
            ends = struct.unpack(f">{seg}H", sub[14:14 + segx2])
            starts = struct.unpack(f">{seg}H", sub[16 + segx2:16 + 2 * segx2])
            deltas = struct.unpack(f">{seg}h", sub[16 + 2 * segx2:16 + 3 * segx2])
            ro_off = 16 + 3 * segx2
            ros = struct.unpack(f">{seg}H", sub[ro_off:ro_off + segx2])
            def lookup(c):
                for k in range(seg):
                    if starts[k] <= c <= ends[k]:
                        if ros[k] == 0:
                            return (c + deltas[k]) & 0xFFFF
                        p = ro_off + 2 * k + ros[k] + 2 * (c - starts[k])
                        g = struct.unpack(">H", sub[p:p + 2])[0]
                        return (g + deltas[k]) & 0xFFFF if g else 0
                return 0
            return lookup

def glyph_contours(T, gid):
    long_loca = struct.unpack(">h", T["head"][50:52])[0]
    loca = T["loca"]
    if long_loca:
        a, b = struct.unpack(">II", loca[4 * gid:4 * gid + 8])
    else:
        a, b = (2 * x for x in struct.unpack(">HH", loca[2 * gid:2 * gid + 4]))
    g = T["glyf"][a:b]
    if not g:
        return []
    nc = struct.unpack(">h", g[:2])[0]
    if nc < 0:  # composite: components, each with an offset
        out, p = [], 10
        while True:
            flags, cg = struct.unpack(">HH", g[p:p + 4]); p += 4
            if flags & 1:
                dx, dy = struct.unpack(">hh", g[p:p + 4]); p += 4
            else:
                dx, dy = struct.unpack(">bb", g[p:p + 2]); p += 2
            if flags & 8: p += 2
            elif flags & 0x40: p += 4
            elif flags & 0x80: p += 8
            out += [[(x + dx, y + dy, on) for x, y, on in c] for c in glyph_contours(T, cg)]
            if not flags & 0x20:
                return out
    ends = struct.unpack(f">{nc}H", g[10:10 + 2 * nc])
    npts = ends[-1] + 1
    p = 10 + 2 * nc
    il = struct.unpack(">H", g[p:p + 2])[0]; p += 2 + il
    flags = []
    while len(flags) < npts:
        f = g[p]; p += 1
        flags.append(f)
        if f & 8:
            r = g[p]; p += 1
            flags += [f] * r
    def coords(short, same):
        nonlocal p
        vals, v = [], 0
        for f in flags:
            if f & short:
                d = g[p]; p += 1
                v += d if f & same else -d
            elif not f & same:
                v += struct.unpack(">h", g[p:p + 2])[0]; p += 2
            vals.append(v)
        return vals
    xs = coords(2, 16); ys = coords(4, 32)
    out, s = [], 0
    for e in ends:
        out.append([(xs[i], ys[i], flags[i] & 1) for i in range(s, e + 1)]); s = e + 1
    return out

def polygon(contour, steps=6):
    pts = contour
    if not pts: return []
    # start at an on-curve point (or the midpoint of two off-curve)
    n = len(pts)
    seq = []
    for i in range(n):
        a, b = pts[i], pts[(i + 1) % n]
        seq.append(a)
        if not a[2] and not b[2]:
            seq.append(((a[0] + b[0]) / 2, (a[1] + b[1]) / 2, 1))
    k = next(i for i, q in enumerate(seq) if q[2])
    seq = seq[k:] + seq[:k] + [seq[k]]
    poly, i = [seq[0][:2]], 1
    while i < len(seq):
        q = seq[i]
        if q[2]:
            poly.append(q[:2]); i += 1
        else:
            p0, c, p1 = poly[-1], q, seq[i + 1]
            for t in range(1, steps + 1):
                t /= steps
                poly.append(((1-t)**2*p0[0] + 2*(1-t)*t*c[0] + t*t*p1[0], (1-t)**2*p0[1] + 2*(1-t)*t*c[1] + t*t*p1[1]))
            i += 2
    return poly

def raster(polys, w, h, ss=4):
    cov = [[0] * w for _ in range(h)]
    for sy in range(h * ss):
        y = (sy + 0.5) / ss
        xs = []
        for poly in polys:
            for (x0, y0), (x1, y1) in zip(poly, poly[1:]):
                if (y0 <= y < y1) or (y1 <= y < y0):
                    xs.append((x0 + (y - y0) * (x1 - x0) / (y1 - y0), 1 if y1 > y0 else -1))
        xs.sort()
        wind, prev = 0, None
        for x, d in xs:
            if wind != 0 and prev is not None:
                a, b = max(prev, 0), min(x, w)
                sx = a
                while sx < b:  # accumulate horizontal coverage in cell units
                    cell = int(sx)
                    nxt = min(b, cell + 1)
                    if 0 <= cell < w:
                        cov[int(sy // ss)][cell] += (nxt - sx) / ss
                    sx = nxt
            wind += d; prev = x
    return cov


def generate(ttf: str) -> str:
    data = open(ttf, "rb").read()
    t = tables(data)
    scale = PX / struct.unpack(">H", t["head"][18:20])[0]
    look = cmap4(t["cmap"])
    rows = bytearray()
    for c in range(FIRST, LAST + 1):
        polys = [[(x * scale, BASELINE - y * scale) for x, y in polygon(ct)] for ct in glyph_contours(t, look(c))]
        for r in raster(polys, WIDTH, HEIGHT):
            rows += bytes(min(15, round(v * 15)) for v in r)
    rows += b"\0" * (len(rows) % 2)
    return base64.b64encode(zlib.compress(bytes((rows[i] << 4) | rows[i + 1] for i in range(0, len(rows), 2)), 9)).decode()


if __name__ == "__main__":
    print(generate(sys.argv[1]))
