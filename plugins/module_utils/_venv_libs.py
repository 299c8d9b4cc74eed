# -*- coding: utf-8 -*-
# Copyright: gpufleet.proxmox contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""A venv's shared libraries resolved as the dynamic loader would, through the ELF reader: which library an
extension module needs and nothing provides (standard library only: it runs with the target's system Python)."""


import glob
import os

from ansible_collections.gpufleet.proxmox.plugins.module_utils import _elf, _venv_dists, _venv_requires


def shared_objects(top):
    """Every shared object under top: regular files (not links) named *.so or *.so.N..., in no set order."""
    found, dirs = [], [top]
    while dirs:
        try:
            entries = os.scandir(dirs.pop())
        except OSError:
            continue
        with entries:
            for entry in entries:
                name = entry.name
                if entry.is_dir(follow_symlinks=False):
                    dirs.append(entry.path)
                elif '.so' in name and (name.endswith('.so') or '.so.' in name) and entry.is_file(follow_symlinks=False):
                    found.append(entry.path)
    return found


def closure(site, resolver, providers, owner=None, requires=None, essential=None):
    """The venv's shared objects resolved as the loader would: (unresolved, optional), each a list of
    {soname, needed_by, provided_by}.

    providers: {soname: {distribution name: [paths of that name it installs]}}; owner: {real path of a shared
    object: its distribution's name}; requires: {distribution name: the names of every distribution it requires,
    transitively}; essential: the names of the distributions whose import must work (those of the venv's imports and
    what they require), None for every distribution.

    A soname that an object's distribution requires and whose file that requirement has installed is not missing:
    the distribution's Python imports its requirement first, and the loader takes a library already loaded by its
    soname (torchvision's and torchaudio's extensions need torch's libc10.so and have no path to it). Of the rest, a
    soname that a distribution of the venv lists but whose file is gone is unresolved (the venv's own library is
    lost), and so is one that an essential extension module needs (the DT_NEEDED closure of the extension modules
    of the essential distributions, which Python loads when it imports them). The rest are optional: system
    libraries that only objects loaded on demand need (plugins a library opens with dlopen, such as NCCL's and
    NVSHMEM's network transports or cuFile's RDMA support, which need their fabric's libraries only where that
    fabric is used), or that only another distribution's optional backends need (cupy's cuTENSOR, numba's TBB
    pool, mpi4py's MPICH variant: each package imports them on demand and does without). A library that Python code
    opens itself (ctypes) counts as one loaded on demand."""
    owner, requires = owner or {}, requires or {}
    infos = {}
    for path in shared_objects(site):
        info = _elf.read(path)
        if info is not None:
            infos[os.path.realpath(path)] = info
    edges, missing = {}, {}
    for real, info in infos.items():
        found = edges[real] = []
        for needed in info.needed:
            where = resolver.find(needed, info)
            if where is None:
                missing.setdefault(needed, []).append(real)
            else:
                found.append(os.path.realpath(where))
    loaded = set()
    todo = [real for real, info in infos.items() if info.module and (essential is None or owner.get(real) in essential)]
    while todo:
        real = todo.pop()
        if real not in loaded:
            loaded.add(real)
            todo.extend(edges.get(real, ()))
    unresolved, optional = [], []
    for soname, needers in sorted(missing.items()):
        listed = providers.get(soname, {})
        present = set(name for name, paths in listed.items() if any(os.path.exists(p) for p in paths))
        needers = [n for n in needers if not present.intersection(requires.get(owner.get(n), ()))]
        if not needers:
            continue
        item = {'soname': soname, 'needed_by': sorted(os.path.relpath(infos[n].path, site) for n in needers),
                'provided_by': sorted(listed)}
        (unresolved if (listed and not present) or loaded.intersection(needers) else optional).append(item)
    return unresolved, optional


def unresolved_libraries(site, dists, locked, edges=(), imports=()):
    """The shared-library closure (see closure), the loader's search path extended with the nvidia wheels'
    lib directories: (unresolved, optional), each unresolved library with in_lock, the names of the locked
    distributions that provide it. edges: requirement_edges' answer; imports: the modules whose import must work
    (their distributions and what those require are the essential ones), none for every distribution."""
    nvidia_dirs = sorted(glob.glob(os.path.join(site, 'nvidia', '*', 'lib')))
    resolver = _elf.Resolver(extra_dirs=nvidia_dirs)
    providers, owner = {}, {}
    for d in dists:
        for path, _rel, _digest, _size in d['files']:
            if '.so' in path:
                providers.setdefault(os.path.basename(path), {}).setdefault(d['name'], []).append(path)
                owner[os.path.realpath(path)] = d['name']
    requires = _venv_requires.requirements(dists, edges)
    essential = None
    if imports:
        tops = set(name.split('.', 1)[0] for name in imports)
        essential = set()
        for d in dists:
            if any(rel.split('/', 1)[0].split('.', 1)[0] in tops for _path, rel, _digest, _size in d['files']):
                essential.add(d['name'])
                essential.update(requires[d['name']])
    unresolved, optional = closure(site, resolver, providers, owner, requires, essential)
    for u in unresolved:
        u['in_lock'] = sorted(locked[_venv_dists.canon(p)][0] for p in u['provided_by'] if _venv_dists.canon(p) in locked)
    return unresolved, optional
