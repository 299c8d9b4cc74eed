# -*- coding: utf-8 -*-
# Copyright: gpufleet.proxmox contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Just enough ELF to resolve shared libraries as the dynamic loader does (standard library only).

`read(path)` gives an object's class, machine, soname, DT_NEEDED, DT_RPATH and DT_RUNPATH, and whether it is
a Python extension module, reading only the headers, the dynamic section and its strings (a 1 GB libtorch costs a
few reads).
"""


import os
import struct

PT_LOAD, PT_DYNAMIC = 1, 2
DT_NULL, DT_NEEDED, DT_STRTAB, DT_STRSZ, DT_SONAME, DT_RPATH, DT_RUNPATH = 0, 1, 5, 10, 14, 15, 29
SYSTEM_DIRS = ('/lib/x86_64-linux-gnu', '/usr/lib/x86_64-linux-gnu', '/lib64', '/usr/lib64', '/lib', '/usr/lib',
               '/lib/aarch64-linux-gnu', '/usr/lib/aarch64-linux-gnu')


class ElfInfo(object):
    __slots__ = ('path', 'bits', 'machine', 'soname', 'needed', 'rpath', 'runpath', 'module')

    def __init__(self, path, bits, machine, soname, needed, rpath, runpath, module=False):
        self.path, self.bits, self.machine = path, bits, machine
        self.soname, self.needed, self.rpath, self.runpath = soname, needed, rpath, runpath
        self.module = module  # a Python extension module: Python can import it (and so loads what it needs)


def read(path):
    """ElfInfo of a dynamic ELF object, or None for anything else (not ELF, static, unreadable)."""
    try:
        with open(path, 'rb') as fh:
            ident = fh.read(64)
            if len(ident) < 52 or ident[:4] != b'\x7fELF':
                return None
            bits = 64 if ident[4] == 2 else 32
            end = '<' if ident[5] == 1 else '>'
            if bits == 64:
                machine, = struct.unpack(end + 'H', ident[18:20])
                phoff, = struct.unpack(end + 'Q', ident[32:40])
                phentsize, phnum = struct.unpack(end + 'HH', ident[54:58])
            else:
                machine, = struct.unpack(end + 'H', ident[18:20])
                phoff, = struct.unpack(end + 'I', ident[28:32])
                phentsize, phnum = struct.unpack(end + 'HH', ident[42:46])
            fh.seek(phoff)
            table = fh.read(phentsize * phnum)
            loads, dynamic = [], None
            for i in range(phnum):
                raw = table[i * phentsize:(i + 1) * phentsize]
                if bits == 64:
                    p_type, _flags, off, vaddr, _paddr, filesz = struct.unpack(end + 'IIQQQQ', raw[:40])
                else:
                    p_type, off, vaddr, _paddr, filesz = struct.unpack(end + 'IIIII', raw[:20])
                if p_type == PT_LOAD:
                    loads.append((vaddr, off, filesz))
                elif p_type == PT_DYNAMIC:
                    dynamic = (off, filesz)
            if dynamic is None:
                return None
            fh.seek(dynamic[0])
            data = fh.read(dynamic[1])
            size = 16 if bits == 64 else 8
            fmt = end + ('qQ' if bits == 64 else 'iI')
            entries = []
            for i in range(len(data) // size):
                tag, val = struct.unpack(fmt, data[i * size:(i + 1) * size])
                if tag == DT_NULL:
                    break
                entries.append((tag, val))
            strtab = dict(entries).get(DT_STRTAB)
            strsz = dict(entries).get(DT_STRSZ, 0)
            if strtab is None:
                return None
            base = next((off + strtab - vaddr for vaddr, off, sz in loads if vaddr <= strtab < vaddr + sz), strtab)
            fh.seek(base)
            strings = fh.read(strsz)
    except (IOError, OSError, struct.error):
        return None

    def text(offset):
        stop = strings.find(b'\0', offset)
        return strings[offset:stop if stop >= 0 else None].decode('utf-8', 'replace')
    needed = [text(v) for t, v in entries if t == DT_NEEDED]
    soname = next((text(v) for t, v in entries if t == DT_SONAME), None)
    rpath = [p for t, v in entries if t == DT_RPATH for p in text(v).split(':') if p]
    runpath = [p for t, v in entries if t == DT_RUNPATH for p in text(v).split(':') if p]
    # Python imports NAME from NAME.so, NAME.abi3.so or NAME.cpython-*.so, through the symbol PyInit_NAME.
    name = os.path.basename(path)
    module = name.endswith('.so') and (b'PyInit_' + name.split('.', 1)[0].encode('utf-8') + b'\0') in strings
    return ElfInfo(path, bits, machine, soname, needed, rpath, runpath, module)


def expand(entry, origin):
    return entry.replace('$ORIGIN', origin).replace('${ORIGIN}', origin)


def ldconfig_dirs():
    """Directories named in /etc/ld.so.conf (and its includes), then the system's defaults."""
    dirs = []

    def load(path):
        try:
            with open(path) as fh:
                lines = fh.read().splitlines()
        except (IOError, OSError):
            return
        for line in lines:
            line = line.split('#', 1)[0].strip()
            if line.startswith('include '):
                import glob
                for inc in sorted(glob.glob(line.split(None, 1)[1])):
                    load(inc)
            elif line:
                dirs.append(line)
    load('/etc/ld.so.conf')
    return dirs + [d for d in SYSTEM_DIRS if d not in dirs]


class Resolver(object):
    """Resolve DT_NEEDED the way ld.so does: RPATH (when no RUNPATH), RUNPATH, extra dirs, system dirs."""

    def __init__(self, extra_dirs=(), system_dirs=None):
        self.extra = list(extra_dirs)
        self.system = list(system_dirs) if system_dirs is not None else ldconfig_dirs()
        self._cache = {}

    def _fits(self, path, obj):
        info = self._info(path)
        return info is not None and info.bits == obj.bits and info.machine == obj.machine

    def _info(self, path):
        if path not in self._cache:
            self._cache[path] = read(path) if os.path.isfile(path) else None
        return self._cache[path]

    def find(self, name, obj):
        """Where the loader would find name for obj, or None."""
        if '/' in name:
            return name if os.path.exists(name) else None
        origin = os.path.dirname(obj.path)
        dirs = ([expand(d, origin) for d in obj.rpath] if not obj.runpath else []) + \
            [expand(d, origin) for d in obj.runpath] + self.extra + self.system
        for d in dirs:
            candidate = os.path.join(d, name)
            if os.path.exists(candidate) and self._fits(candidate, obj):
                return candidate
        return None
