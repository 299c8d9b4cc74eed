# -*- coding: utf-8 -*-
# Copyright: gpufleet.proxmox contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""What a venv's distributions require (their Requires-Dist, with environment markers evaluated as pip does for the
venv's own Python) and what is missing of it (standard library only: it runs with the target's system Python)."""


import io
import os
import re

from ansible_collections.gpufleet.proxmox.plugins.module_utils import _venv_dists


# -- Requires-Dist ------------------------------------------------------------------------
MARKER_TOKEN = re.compile(r'\s*(?:(?P<paren>[()])|(?P<op>===|==|!=|<=|>=|~=|<|>|not\s+in\b|in\b)|(?P<bool>and|or)\b|'
                          r"'(?P<sq>[^']*)'|\"(?P<dq>[^\"]*)\"|(?P<var>[A-Za-z_][A-Za-z0-9_.]*))")


VERSION_VARS = ('python_version', 'python_full_version', 'implementation_version', 'platform_release')


def _version(text):
    parts = re.match(r'^\s*(\d+(?:\.\d+)*)', text or '')
    return tuple(int(p) for p in parts.group(1).split('.')) if parts else None


def _compare(left, op, right, version):
    if op in ('in', 'not in') or re.sub(r'\s+', ' ', op) == 'not in':
        found = left in right
        return found if op == 'in' else not found
    if version:
        a, b = _version(left), _version(right.rstrip('.*'))
        if a is None or b is None:
            raise ValueError(right)
        if right.endswith('.*') and op in ('==', '!='):
            same = a[:len(b)] == b
            return same if op == '==' else not same
        size = max(len(a), len(b))
        a, b = a + (0,) * (size - len(a)), b + (0,) * (size - len(b))
        if op == '~=':
            return a >= b and a[:len(_version(right)) - 1] == b[:len(_version(right)) - 1]
    else:
        a, b = left, right
    return {'==': a == b, '===': left == right, '!=': a != b, '<': a < b, '<=': a <= b, '>': a > b,
            '>=': a >= b}.get(op, False) if op != '~=' else False


def marker_holds(marker, env, extras):
    """Whether a PEP 508 marker holds in env ({variable: value}) for a distribution asked for with extras (a set
    of canonical names). Raises ValueError for a marker it cannot read."""
    tokens, pos = [], 0
    marker = marker.strip()
    while pos < len(marker):
        m = MARKER_TOKEN.match(marker, pos)
        if not m or m.end() == pos:
            raise ValueError(marker)
        pos = m.end()
        kind = m.lastgroup
        value = m.group(kind)
        if kind in ('sq', 'dq'):
            tokens.append(('str', value))
        elif kind == 'op':
            tokens.append(('op', re.sub(r'\s+', ' ', value)))
        else:
            tokens.append((kind, value))
    tokens.append(('end', None))
    at = [0]

    def take():
        at[0] += 1
        return tokens[at[0] - 1]

    def value():
        kind, text = take()
        if kind == 'str':
            return text, None
        if kind == 'var':
            if text == 'extra':
                return None, 'extra'
            if text not in env:
                raise ValueError(text)
            return env[text], text
        raise ValueError(text)

    def atom():
        if tokens[at[0]] == ('paren', '('):
            take()
            out = either()
            if take() != ('paren', ')'):
                raise ValueError(marker)
            return out
        (left, lvar), (kind, op), (right, rvar) = value(), take(), value()
        if kind != 'op':
            raise ValueError(marker)
        if 'extra' in (lvar, rvar):
            wanted = _venv_dists.canon(right if lvar == 'extra' else left)
            if op in ('==', '==='):
                return wanted in extras
            if op == '!=':
                return wanted not in extras
            raise ValueError(marker)
        return _compare(left, op, right, lvar in VERSION_VARS or rvar in VERSION_VARS)

    def both():
        out = atom()
        while tokens[at[0]] == ('bool', 'and'):
            take()
            out = atom() and out
        return out

    def either():
        out = both()
        while tokens[at[0]] == ('bool', 'or'):
            take()
            out = both() or out
        return out
    out = either()
    if tokens[at[0]][0] != 'end':
        raise ValueError(marker)
    return out


REQUIRES = re.compile(r'^\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*(?:\[([^\]]*)\])?')


def marker_env(venv, site):
    """The marker variables of the venv's Python (its version from pyvenv.cfg or its site-packages directory)."""
    import platform
    import sys
    short = os.path.basename(os.path.dirname(site))[len('python'):]
    full = short
    try:
        with io.open(os.path.join(venv, 'pyvenv.cfg'), encoding='utf-8') as fh:
            for line in fh:
                key, _sep, val = line.partition('=')
                if key.strip() in ('version', 'version_info') and _version(val.strip()):
                    full = val.strip()
    except (IOError, OSError):
        pass
    return {'os_name': os.name, 'sys_platform': sys.platform, 'platform_system': platform.system(),
            'platform_machine': platform.machine(), 'platform_release': platform.release(),
            'platform_version': platform.version(), 'platform_python_implementation': platform.python_implementation(),
            'implementation_name': sys.implementation.name, 'python_version': short,
            'python_full_version': full, 'implementation_version': full}


def requirement_edges(dists, env):
    """[(requirer's name, canonical name required, the requirement's text without its marker, holds)] for every
    Requires-Dist of the installed distributions, holds True where its marker holds (extras as the installed
    distributions ask for them), None where the marker cannot be read, and False where it does not hold."""
    parsed = {}
    for d in dists:
        reqs = []
        for text in d.get('requires') or ():
            spec, _sep, marker = text.partition(';')
            m = REQUIRES.match(spec)
            if m and _venv_dists.canon(m.group(1)) != d['key']:
                extras = set(_venv_dists.canon(e) for e in (m.group(2) or '').split(',') if e.strip())
                reqs.append((_venv_dists.canon(m.group(1)), extras, marker.strip(), spec.strip()))
        parsed[d['key']] = reqs
    # the extras asked of each distribution grow until no holding requirement asks for more
    asked = dict((d['key'], set()) for d in dists)
    changed = True
    while changed:
        changed = False
        for d in dists:
            for key, extras, marker, _spec in parsed[d['key']]:
                if key in asked and not extras <= asked[key] and _holds(marker, env, asked[d['key']]) is not False:
                    asked[key] |= extras
                    changed = True
    edges = []
    for d in dists:
        for key, _extras, marker, spec in parsed[d['key']]:
            edges.append((d['name'], key, spec, _holds(marker, env, asked[d['key']])))
    return edges


def _holds(marker, env, extras):
    try:
        return not marker or marker_holds(marker, env, extras)
    except ValueError:
        return None


def required_by(edges):
    """{canonical name: [names of the installed distributions whose Requires-Dist names it]}, from
    requirement_edges' answer: each Requires-Dist taken where its marker holds (extras as the installed
    distributions ask for them). A marker it cannot read counts as holding."""
    out = {}
    for name, key, _spec, holding in edges:
        if holding is not False:
            names = out.setdefault(key, [])
            if name not in names:
                names.append(name)
    return dict((k, sorted(v)) for k, v in out.items())


def missing_requirements(dists, edges):
    """What `pip check` calls not installed: [{name, requirement, required_by}] for each distribution that an
    installed one requires (requirement_edges' answer: its marker holding for the venv; one that cannot be read is
    left out) and that is not installed. The incident's uninstall of the cu13 wheels that torch 2.11.0 requires is named here whole, without a
    lock (with one, the lock says what belongs in the venv, and its drift names what is missing)."""
    installed = set(d['key'] for d in dists)
    out = {}
    for name, key, spec, holding in edges:
        if holding is True and key not in installed:
            item = out.setdefault(key, {'name': REQUIRES.match(spec).group(1), 'requirement': spec, 'required_by': []})
            if name not in item['required_by']:
                item['required_by'].append(name)
    return [dict(item, required_by=sorted(item['required_by'])) for _key, item in sorted(out.items())]


def requirements(dists, edges):
    """{distribution name: the names of the installed distributions it requires, transitively}, from
    requirement_edges' answer (a requirement whose marker cannot be read counts, as in required_by)."""
    names = dict((d['key'], d['name']) for d in dists)
    direct = {}
    for requirer, key, _spec, holding in edges:
        if holding is not False and key in names:
            direct.setdefault(requirer, set()).add(names[key])
    out = {}
    for name in names.values():
        seen, todo = set(), list(direct.get(name, ()))
        while todo:
            dep = todo.pop()
            if dep not in seen and dep != name:
                seen.add(dep)
                todo.extend(direct.get(dep, ()))
        out[name] = seen
    return out
