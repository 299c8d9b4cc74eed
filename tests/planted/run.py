"""Plant each bug of tests/planted/bugs.py in a copy of the checkout, one at a time, and run the unit suite on it:
every bug must make it fail. Prints one line a bug (caught, or SURVIVED) and the time taken; exits 1 when a bug
survives or cannot be planted.

    python tests/planted/run.py [name ...]     (make planted)
"""

import os
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
from bugs import BUGS  # noqa: E402


def checkout_copy(dest):
    """The checkout's files (tracked and untracked, not ignored) copied to dest, links kept as links."""
    names = subprocess.run(['git', 'ls-files', '-co', '--exclude-standard', '-z'], cwd=ROOT, check=True,
                           capture_output=True).stdout.decode().split('\0')
    for name in filter(None, names):
        src, dst = os.path.join(ROOT, name), os.path.join(dest, name)
        if not os.path.lexists(src):
            continue
        os.makedirs(os.path.dirname(dst), exist_ok=True)
        if os.path.islink(src):
            os.symlink(os.readlink(src), dst)
        else:
            shutil.copy2(src, dst)
    # a repository of its own: tests that ask git what the project tracks ask the copy
    subprocess.run('git init -q && git add -A', shell=True, cwd=dest, check=True)


def plant(copy, path, old, new):
    target = os.path.join(copy, path)
    with open(target) as fh:
        text = fh.read()
    if text.count(old) != 1:
        return 'the code to plant it in is found {0} times in {1}, not once'.format(text.count(old), path)
    with open(target, 'w') as fh:
        fh.write(text.replace(old, new))
    return None


def try_bug(bug):
    name, _says, path, old, new = bug
    with tempfile.TemporaryDirectory(prefix='planted-') as tmp:
        checkout_copy(tmp)
        problem = path and plant(tmp, path, old, new)
        if problem:
            return name, 'NOT PLANTED', problem
        env = dict(os.environ, PYTHONPATH=os.path.join(tmp, 'src'), PYTHONDONTWRITEBYTECODE='1')
        out = subprocess.run([sys.executable, '-m', 'pytest', '-q', '-x', '-p', 'no:cacheprovider', 'tests/unit'],
                             cwd=tmp, env=env, capture_output=True, text=True, check=False)
        if not path:  # the copy as it is: the suite must pass on it, or no failure below means anything
            return name, 'caught' if out.returncode else 'passes', out.stdout.strip().splitlines()[-1][:150]
        if out.returncode == 0:
            return name, 'SURVIVED', 'the unit suite passed with it'
        failed = [line for line in out.stdout.splitlines() if line.startswith('FAILED') or line.startswith('ERROR')]
        return name, 'caught', (failed[0] if failed else out.stdout.strip().splitlines()[-1])[:150]


def main(argv):
    chosen = [b for b in BUGS if not argv or b[0] in argv]
    started = time.time()
    _name, state, detail = try_bug(('none', '', None, None, None))
    if state != 'passes':
        print('the unit suite fails on a copy of the checkout without a bug planted: ' + detail)
        return 1
    with ThreadPoolExecutor(max_workers=max(1, min(4, os.cpu_count() or 1))) as pool:
        results = list(pool.map(try_bug, chosen))
    bad = 0
    for (name, state, detail), bug in zip(results, chosen):
        bad += state != 'caught'
        print('{0:<12} {1:<28} {2}\n{3:<12} {4}'.format(state, name, bug[1], '', detail))
    took = time.time() - started
    print('{0} bug(s) planted, {1} caught, {2} not, in {3:.0f} s'.format(len(chosen), len(chosen) - bad, bad, took))
    return 1 if bad else 0


if __name__ == '__main__':
    sys.exit(main(sys.argv[1:]))
