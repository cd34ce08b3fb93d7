"""Load a compiled kernel object (an ELF x86-64 relocatable ``.o``) into this process.

The builder (:mod:`workbench.compiled.build`, in a subprocess with numba) writes one object
file per kernel module: position-independent machine code for the host CPU whose only exports
are the kernels' C entry points. Loading it needs neither numba nor LLVM here (they would add
about 160 MB to the process and seconds of imports): the loader lays the object's allocated
sections out in fresh pages, resolves the few C library functions the code may call
(``memset``, ``memcpy``, the ``libm`` functions) through small jump stubs, applies the x86-64
relocations, then makes the code pages read + execute (never writable and executable at once).
What cannot be loaded (another machine type, an unknown relocation, a symbol outside the
allowed C library functions) raises :class:`ImageError`; the engine then keeps its numpy path.
"""

from __future__ import annotations

import ctypes
import mmap
import struct
import sys

PAGE = mmap.PAGESIZE

# ELF constants (the System V ABI and its x86-64 supplement)
_EM_X86_64 = 62
_ET_REL = 1
_SHT_SYMTAB, _SHT_RELA, _SHT_NOBITS = 2, 4, 8
_SHF_WRITE, _SHF_ALLOC, _SHF_EXECINSTR = 1, 2, 4
_SHN_UNDEF, _SHN_ABS, _SHN_COMMON = 0, 0xFFF1, 0xFFF2
_STB_GLOBAL, _STB_WEAK = 1, 2
_R_64, _R_PC32, _R_PLT32, _R_GOTPCREL, _R_32, _R_32S, _R_PC64 = 1, 2, 4, 9, 10, 11, 24
_R_GOTPCRELX, _R_REX_GOTPCRELX = 41, 42

#: the only external functions a kernel may call (resolved in this process' C library)
ALLOWED_EXTERNALS = frozenset("""
memset memcpy memmove
expf exp logf log log1pf log1p expm1f expm1 tanhf tanh erff erf erfcf erfc sqrtf sqrt
powf pow sinf sin cosf cos fmodf fmod floorf floor ceilf ceil roundf round truncf trunc
nearbyintf nearbyint rintf rint fabsf fabs fmaf fma fminf fmin fmaxf fmax atanf atan
atan2f atan2 asinf asin acosf acos sinhf sinh coshf cosh asinhf asinh acoshf acosh atanhf
atanh exp2f exp2 log2f log2 log10f log10 cbrtf cbrt hypotf hypot ldexpf ldexp frexpf frexp
""".split())


class ImageError(Exception):
    """A kernel object that this loader cannot (or will not) load."""


def supported() -> str | None:
    """None when this process can load kernel objects, else why not (one line)."""
    import platform  # noqa: PLC0415

    if not sys.platform.startswith("linux"):
        return f"compiled kernels load on Linux only (this is {sys.platform})"
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return f"compiled kernels load on x86-64 only (this is {platform.machine()})"
    return None


def _sections(data: bytes):
    if data[:4] != b"\x7fELF" or len(data) < 64:
        raise ImageError("not an ELF object")
    if data[4] != 2 or data[5] != 1:
        raise ImageError("not a 64-bit little-endian ELF object")
    e_type, e_machine = struct.unpack_from("<HH", data, 16)
    if e_type != _ET_REL or e_machine != _EM_X86_64:
        raise ImageError(f"not an x86-64 relocatable object (type {e_type}, machine "
                         f"{e_machine})")
    (shoff,) = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 0x3A)
    if shoff + shnum * shentsize > len(data) or shstrndx >= shnum:
        raise ImageError("truncated ELF object")
    secs = []
    for i in range(shnum):
        f = struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize)
        secs.append({"name": f[0], "type": f[1], "flags": f[2], "off": f[4], "size": f[5],
                     "link": f[6], "info": f[7], "align": max(1, f[8]), "entsize": f[9]})
    names = secs[shstrndx]

    def cstr(sec, o):
        s = sec["off"] + o
        return data[s:data.index(b"\0", s)].decode("utf-8", "replace")
    for s in secs:
        s["name"] = cstr(names, s["name"])
        if s["type"] != _SHT_NOBITS and s["off"] + s["size"] > len(data):
            raise ImageError(f"section {s['name']} runs past the end of the object")
    return secs, cstr


def _symbols(data, secs, cstr):
    tab = next((s for s in secs if s["type"] == _SHT_SYMTAB), None)
    if tab is None:
        raise ImageError("the object has no symbol table")
    strtab = secs[tab["link"]]
    out = []
    for k in range(tab["size"] // 24):
        name, info, _other, shndx, value, size = struct.unpack_from(
            "<IBBHQQ", data, tab["off"] + 24 * k)
        out.append({"name": cstr(strtab, name) if name else "", "bind": info >> 4,
                    "type": info & 15, "shndx": shndx, "value": value, "size": size})
    return out


class _Libc:
    """mmap/mprotect/dlsym through ctypes (resolved once)."""

    def __init__(self):
        self.lib = ctypes.CDLL(None, use_errno=True)
        self.mprotect = self.lib.mprotect
        self.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        self.mprotect.restype = ctypes.c_int

    def address(self, name: str) -> int:
        try:
            fn = getattr(self.lib, name)
        except AttributeError:
            try:  # libm may not be global in every interpreter build
                fn = getattr(ctypes.CDLL("libm.so.6"), name)
            except (OSError, AttributeError):
                raise ImageError(f"the C library has no {name}") from None
        return ctypes.cast(fn, ctypes.c_void_p).value


_LIBC: list = []
#: mappings of loaded images: kept for the life of the process (their code may be running)
_MAPPINGS: list = []


def load(data: bytes) -> dict:
    """Load the relocatable object ``data``; returns ``{exported symbol: address}``.

    The mapping stays for the life of the process (function pointers into it are handed
    out)."""
    why = supported()
    if why:
        raise ImageError(why)
    secs, cstr = _sections(data)
    syms = _symbols(data, secs, cstr)
    # the allocated sections, code first (read + execute), then writable data (read + write)
    code, rw = [], []
    for i, s in enumerate(secs):
        if not s["flags"] & _SHF_ALLOC or s["name"] in (".eh_frame", ".note.GNU-stack"):
            continue
        (rw if s["flags"] & _SHF_WRITE else code).append(i)
    base_of: dict[int, int] = {}
    pos = 0
    for i in code:
        a = secs[i]["align"]
        pos = -(-pos // a) * a
        base_of[i] = pos
        pos += secs[i]["size"]
    # stubs for external functions: "jmp *0(%rip)" + the 8-byte address (also the GOT slot)
    externals = sorted({s["name"] for s in syms if s["shndx"] == _SHN_UNDEF and s["name"]})
    for name in externals:
        if name not in ALLOWED_EXTERNALS:
            raise ImageError(f"the kernel object calls {name!r}, which is not one of the C "
                             f"library functions a kernel may use")
    pos = -(-pos // 16) * 16
    stub_at = {}
    for name in externals:
        stub_at[name] = pos
        pos += 16
    code_size = -(-max(pos, 1) // PAGE) * PAGE
    pos = code_size
    commons = {}
    for i in rw:
        a = secs[i]["align"]
        pos = -(-pos // a) * a
        base_of[i] = pos
        pos += secs[i]["size"]
    for k, s in enumerate(syms):
        if s["shndx"] == _SHN_COMMON:
            a = max(1, s["value"])
            pos = -(-pos // a) * a
            commons[k] = pos
            pos += s["size"]
    total = -(-max(pos, 1) // PAGE) * PAGE

    img = bytearray(total)
    for i, off in base_of.items():
        s = secs[i]
        if s["type"] != _SHT_NOBITS:
            img[off:off + s["size"]] = data[s["off"]:s["off"] + s["size"]]

    mm = mmap.mmap(-1, total, prot=mmap.PROT_READ | mmap.PROT_WRITE)
    buf = (ctypes.c_char * total).from_buffer(mm)
    base = ctypes.addressof(buf)
    if not _LIBC:
        _LIBC.append(_Libc())
    libc = _LIBC[0]
    for name, off in stub_at.items():
        img[off:off + 6] = b"\xff\x25\x00\x00\x00\x00"
        img[off + 6:off + 14] = struct.pack("<Q", libc.address(name))

    def sym_address(k: int) -> int:
        s = syms[k]
        if s["shndx"] == _SHN_UNDEF:
            if not s["name"]:
                raise ImageError("a relocation refers to an unnamed undefined symbol")
            return base + stub_at[s["name"]]
        if s["shndx"] == _SHN_ABS:
            return s["value"]
        if s["shndx"] == _SHN_COMMON:
            return base + commons[k]
        if s["shndx"] not in base_of:
            raise ImageError(f"symbol {s['name']!r} lives in a section that is not loaded "
                             f"({secs[s['shndx']]['name']})")
        return base + base_of[s["shndx"]] + s["value"]

    for rel in secs:
        if rel["type"] != _SHT_RELA or rel["info"] not in base_of:
            continue
        target = base_of[rel["info"]]
        for k in range(rel["size"] // 24):
            off, info, addend = struct.unpack_from("<QQq", data, rel["off"] + 24 * k)
            rtype, ksym = info & 0xFFFFFFFF, info >> 32
            where = target + off
            P = base + where
            if rtype == _R_64:
                struct.pack_into("<Q", img, where, (sym_address(ksym) + addend) & (2**64 - 1))
            elif rtype in (_R_PC32, _R_PLT32):
                v = sym_address(ksym) + addend - P
                if not -2**31 <= v < 2**31:
                    raise ImageError("a 32-bit PC-relative relocation is out of range")
                struct.pack_into("<i", img, where, v)
            elif rtype == _R_PC64:
                struct.pack_into("<q", img, where, sym_address(ksym) + addend - P)
            elif rtype in (_R_GOTPCREL, _R_GOTPCRELX, _R_REX_GOTPCRELX):
                s = syms[ksym]
                if s["shndx"] != _SHN_UNDEF:
                    raise ImageError(f"GOT relocation to a local symbol {s['name']!r}")
                slot = base + stub_at[s["name"]] + 6
                struct.pack_into("<i", img, where, slot + addend - P)
            else:
                raise ImageError(f"relocation type {rtype} is not supported (the builder "
                                 f"emits position-independent code)")
    ctypes.memmove(base, bytes(img), total)
    if libc.mprotect(base, code_size, mmap.PROT_READ | mmap.PROT_EXEC) != 0:
        err = ctypes.get_errno()
        raise ImageError(f"cannot make the kernel code executable (mprotect: errno {err}); "
                         f"this system forbids executable memory")
    _MAPPINGS.append((mm, buf))
    exports = {}
    for k, s in enumerate(syms):
        if s["bind"] in (_STB_GLOBAL, _STB_WEAK) and s["shndx"] in base_of and s["name"]:
            exports[s["name"]] = sym_address(k)
    return exports
