"""Real wheels built at test time: a "cu12" and a "cu13" flavour of a runtime installing the same
nvidia/fakert/lib/lib{a,b,c}.so.1, and an extension that needs all three through an $ORIGIN RPATH,
as torch's libraries do. The incident at small scale. fake-torch-cu13 requires the cu13 flavour (as torch 2.11.0
from PyPI requires nvidia-nccl-cu13), fake-torch-cu12 the cu12 one (as torch 2.11.0+cu128 does)."""

import argparse
import base64
import hashlib
import os
import shutil
import subprocess
import sysconfig
import tempfile
import zipfile

import pytest

from gpufleet.lab.testing import Index, sha256  # noqa: F401 (Index: for the tests that import it from here)

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CPU = os.path.join(ROOT, 'roles', 'torch_venv', 'files', 'profiles', 'cpu')
# The wheels build_wheels makes, by file name prefix.
FAKES = ('fake_rt_cu12', 'fake_rt_cu13', 'fake_torch', 'fake_contaminant', 'fake_extra', 'fake_plugins',
         'fake_globaldeps', 'fake_core', 'fake_vision')

LIBS = ('libfakea.so.1', 'libfakeb.so.1', 'libfakec.so.1')
EXTENSION = """#define Py_LIMITED_API 0x030B0000
#include <Python.h>
extern const char *flavour_a(void);
extern const char *flavour_b(void);
extern const char *flavour_c(void);
static PyObject *probe(PyObject *self, PyObject *unused) { flavour_b(); flavour_c(); return PyUnicode_FromString(flavour_a()); }
static PyMethodDef methods[] = {{"probe", probe, METH_NOARGS, NULL}, {NULL, NULL, 0, NULL}};
static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_C", NULL, -1, methods};
PyMODINIT_FUNC PyInit__C(void) { return PyModule_Create(&module); }
"""
LIBDIR = 'nvidia/fakert/lib'
SAME_BYTES = {'nvidia/__init__.py': b'', 'nvidia/fakert/include/fakert.h': b'int flavour(void);\n'}


def gcc(out, source, *args):
    src = out + '.c'
    with open(src, 'w') as fh:
        fh.write(source)
    subprocess.run(['gcc', '-shared', '-fPIC', '-o', out, src] + list(args), check=True)
    os.unlink(src)
    with open(out, 'rb') as fh:
        return fh.read()


def wheel(where, dist, version, files, requires=()):
    """A real wheel: files {relpath: bytes} plus its dist-info with a RECORD of sha256 and sizes, and its
    requires as Requires-Dist."""
    info = '{0}-{1}.dist-info'.format(dist.replace('-', '_'), version)
    files = dict(files)
    files[info + '/METADATA'] = ('Metadata-Version: 2.1\nName: {0}\nVersion: {1}\n'.format(dist, version) + ''.join(
        'Requires-Dist: {0}\n'.format(r) for r in requires)).encode()
    files[info + '/WHEEL'] = b'Wheel-Version: 1.0\nGenerator: gpufleet-tests\nRoot-Is-Purelib: false\nTag: py3-none-any\n'
    record = []
    for rel, data in sorted(files.items()):
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b'=').decode()
        record.append('{0},sha256={1},{2}'.format(rel, digest, len(data)))
    record.append(info + '/RECORD,,')
    files[info + '/RECORD'] = ('\n'.join(record) + '\n').encode()
    path = os.path.join(where, '{0}-{1}-py3-none-any.whl'.format(dist.replace('-', '_'), version))
    with zipfile.ZipFile(path, 'w') as zf:
        for rel, data in sorted(files.items()):
            zf.writestr(rel, data)
    return path


@pytest.fixture(scope='module')
def wheels(tmp_path_factory):
    return build_wheels(str(tmp_path_factory.mktemp('wheels')), str(tmp_path_factory.mktemp('build')))


def build_wheels(d, build):
    """The incident's wheels into d (gcc builds the libraries in build)."""
    flavours = {}
    for flavour in ('cu12', 'cu13'):
        # The two flavours' libraries differ in size too, as NVIDIA's builds do.
        flavours[flavour] = dict(('{0}/{1}'.format(LIBDIR, lib), gcc(os.path.join(build, flavour + lib), (
            'const char *flavour_{0}(void) {{ return "{1}"; }}\nconst char build_{2}[] = "{3}";\n').format(
                lib[7], flavour, flavour, 'x' * (8192 if flavour == 'cu13' else 1)), '-Wl,-soname,' + lib))
            for lib in LIBS)
        # As NVIDIA's cu12 and cu13 builds of one release do, both flavours also install files with the same bytes.
        flavours[flavour].update(SAME_BYTES)
        wheel(d, 'fake-rt-' + flavour, '1.0', flavours[flavour])
    libs = [os.path.join(build, 'cu12' + lib) for lib in LIBS]
    for lib, path in zip(LIBS, libs):
        os.rename(path, os.path.join(build, lib))
    # fake_torch._C is a Python extension module (the stable ABI, so any CPython 3.11+ imports it), as torch._C is:
    # importing it loads the three libraries, found through its RPATH.
    ext = gcc(os.path.join(build, '_C.so'), EXTENSION,
              *([os.path.join(build, lib) for lib in LIBS] + ['-I' + sysconfig.get_paths()['include'],
                                                              '-Wl,--disable-new-dtags', "-Wl,-rpath,$ORIGIN/../" + LIBDIR]))
    init = b'from fake_torch._C import probe\nFLAVOUR = probe()\n'
    wheel(d, 'fake-torch', '1.0', {'fake_torch/__init__.py': init, 'fake_torch/_C.so': ext})
    for flavour in ('cu12', 'cu13'):
        package = 'fake_torch_' + flavour
        wheel(d, 'fake-torch-' + flavour, '1.0', {
            package + '/__init__.py': 'from {0}._C import probe\nFLAVOUR = probe()\n'.format(package).encode(),
            package + '/_C.so': ext}, requires=['fake-rt-{0}==1.0; platform_system == "Linux"'.format(flavour),
                                                'fake-extra; extra == "extra"'])
    wheel(d, 'fake-extra', '1.0', {'fake_extra/__init__.py': b''})
    plugins(d, build)
    globaldeps(d, build)
    core_and_vision(d, build)
    wheel(d, 'fake-contaminant', '2.0', {'{0}/libfakea.so.1'.format(LIBDIR): flavours['cu12'][LIBDIR + '/libfakea.so.1'] + b'\0junk',
                                         'fake_contaminant/__init__.py': b''})
    return d


def plugins(d, build):
    """fake-plugins: system libraries no wheel ships, needed by an extension module (through a library of its
    own) and by a plugin that only a dlopen would load, as NVSHMEM's fabric transports need libfabric."""
    sysfab, sysreq = (os.path.join(build, n) for n in ('libfakefabric.so.1', 'libfakesys.so.1'))
    gcc(sysfab, 'int fabric(void) { return 1; }\n', '-Wl,-soname,libfakefabric.so.1')
    gcc(sysreq, 'int sysreq(void) { return 2; }\n', '-Wl,-soname,libfakesys.so.1')
    helper = os.path.join(build, 'libfakehelper.so.1')
    gcc(helper, 'extern int sysreq(void);\nint helper(void) { return sysreq(); }\n', sysreq,
        '-Wl,-soname,libfakehelper.so.1')
    native = gcc(os.path.join(build, '_native.so'), 'extern int helper(void);\nvoid *PyInit__native(void) '
                 '{ helper(); return 0; }\n', helper, "-Wl,-rpath,$ORIGIN")
    transport = gcc(os.path.join(build, 'transport_fabric.so.3'), 'extern int fabric(void);\n'
                    'int transport(void) { return fabric(); }\n', sysfab)
    with open(helper, 'rb') as fh:
        wheel(d, 'fake-plugins', '1.0', {'fake_plugins/__init__.py': b'', 'fake_plugins/_native.so': native,
                                         'fake_plugins/libfakehelper.so.1': fh.read(),
                                         'fake_plugins/transport_fabric.so.3': transport})


MODULE = """#define Py_LIMITED_API 0x030B0000
#include <Python.h>
extern int {call}(void);
static PyObject *probe(PyObject *self, PyObject *unused) {{ return PyLong_FromLong({call}()); }}
static PyMethodDef methods[] = {{{{"probe", probe, METH_NOARGS, NULL}}, {{NULL, NULL, 0, NULL}}}};
static struct PyModuleDef module = {{PyModuleDef_HEAD_INIT, "_C", NULL, -1, methods}};
PyMODINIT_FUNC PyInit__C(void) {{ return PyModule_Create(&module); }}
"""


def core_and_vision(d, build):
    """fake-core ships fake_core/lib/libfakecore.so.1 and an extension that finds it through its RPATH, as torch
    ships torch/lib/libc10.so; fake-vision requires fake-core and its extension needs libfakecore.so.1 with no path
    to it, as torchvision's and torchaudio's need torch's libraries: its __init__ imports fake_core first, and the
    loader takes the library already loaded by its soname."""
    include = '-I' + sysconfig.get_paths()['include']
    lib = os.path.join(build, 'libfakecore.so.1')
    core = gcc(lib, 'int core(void) { return 7; }\n', '-Wl,-soname,libfakecore.so.1')
    core_ext = gcc(os.path.join(build, 'core_C.so'), MODULE.format(call='core'), lib, include,
                   '-Wl,--disable-new-dtags', '-Wl,-rpath,$ORIGIN/lib')
    wheel(d, 'fake-core', '1.0', {'fake_core/__init__.py': b'from fake_core._C import probe\n',
                                  'fake_core/_C.so': core_ext, 'fake_core/lib/libfakecore.so.1': core})
    vision_ext = gcc(os.path.join(build, 'vision_C.so'), MODULE.format(call='core'), lib, include)
    wheel(d, 'fake-vision', '1.0', {'fake_vision/__init__.py': b'import fake_core\nfrom fake_vision._C import probe\n',
                                    'fake_vision/_C.so': vision_ext}, requires=['fake-core'])


def globaldeps(d, build):
    """fake-globaldeps: its __init__ opens a library of its own with ctypes, as torch's opens libtorch_global_deps.so;
    that library needs a system library no wheel ships (libfakeglobal.so.1, made here and not installed). No
    extension module needs either, so only an import shows that it is missing."""
    sysdep = os.path.join(build, 'libfakeglobal.so.1')
    gcc(sysdep, 'int global_dep(void) { return 3; }\n', '-Wl,-soname,libfakeglobal.so.1')
    deps = gcc(os.path.join(build, 'libfake_global_deps.so'), 'extern int global_dep(void);\n'
               'int global_deps(void) { return global_dep(); }\n', sysdep)
    init = (b'import ctypes, os\n'
            b'ctypes.CDLL(os.path.join(os.path.dirname(__file__), "lib", "libfake_global_deps.so"), mode=ctypes.RTLD_GLOBAL)\n')
    wheel(d, 'fake-globaldeps', '1.0', {'fake_globaldeps/__init__.py': init,
                                        'fake_globaldeps/lib/libfake_global_deps.so': deps})


def lock(wheels_dir, path, *names):
    """A hash-locked lock of the named wheels (name==version --hash=sha256:...), as uv pip compile writes."""
    lines = []
    for name in names:
        dist, version = name.split('==')
        whl = os.path.join(wheels_dir, '{0}-{1}-py3-none-any.whl'.format(dist.replace('-', '_'), version))
        lines.append('{0} \\\n    --hash=sha256:{1}\n'.format(name, sha256(whl)))
    with open(path, 'w') as fh:
        fh.write('# hash-locked\n' + ''.join(lines))
    return str(path)


def incident_profile(directory, wheels_dir):
    """A venv profile: the lab's CPU torch lock plus the incident's runtime pair (cu13 declared as the
    override) and the fake torch extension that needs it."""
    os.makedirs(directory)
    shutil.copy(os.path.join(CPU, 'pyproject.toml'), directory)
    fakes = lock(wheels_dir, os.path.join(directory, 'fakes.lock'), 'fake-rt-cu12==1.0', 'fake-rt-cu13==1.0',
                 'fake-torch==1.0')
    with open(os.path.join(CPU, 'requirements.lock')) as a, open(fakes) as b:
        text = a.read() + b.read()
    os.unlink(fakes)
    with open(os.path.join(directory, 'requirements.lock'), 'w') as fh:
        fh.write(text)
    with open(os.path.join(directory, 'profile.yml'), 'w') as fh:
        fh.write('---\npython: "3.11"\nplatform: x86_64-manylinux_2_28\noverrides: [fake-rt-cu13]\ninstall_args: []\n'
                 'imports: [torch, fake_torch]\nexpect: {torch_version: 2.13.0+cpu}\n')
    return directory


def main():
    """Outside pytest (molecule's drift scenario): the wheels into a wheelhouse, the profile beside."""
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--wheelhouse', required=True)
    parser.add_argument('--profile', required=True)
    args = parser.parse_args()
    made = tempfile.mkdtemp()
    build = tempfile.mkdtemp()
    try:
        build_wheels(made, build)
        for name in os.listdir(made):
            shutil.copy(os.path.join(made, name), args.wheelhouse)
        if os.path.exists(args.profile):
            shutil.rmtree(args.profile)
        incident_profile(args.profile, made)
    finally:
        shutil.rmtree(made)
        shutil.rmtree(build)


if __name__ == '__main__':
    main()
