"""Venv profiles: every shipped profile's input, lock and profile.yml agree, and disagreement is named."""

import glob
import os
import shutil

import pytest

from gpufleet import profiles

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SHIPPED = os.path.join(ROOT, 'roles', 'torch_venv', 'files', 'profiles')
LOCKED = sorted(os.path.dirname(p) for p in glob.glob(os.path.join(SHIPPED, '*', 'requirements.lock')))


@pytest.mark.parametrize('directory', LOCKED, ids=os.path.basename)
def test_shipped_profiles_agree(directory):
    assert profiles.check(directory) == []
    with open(os.path.join(directory, 'requirements.lock')) as fh:
        assert 'gpufleet profile lock roles/torch_venv/files/profiles/' in fh.read(500)


def test_the_default_profile_pins_the_mission_stack():
    meta = profiles.load(os.path.join(SHIPPED, 'default'))
    assert meta['dependencies'] == ['torch==2.11.0+cu128', 'nvidia-cudnn-cu13==9.19.0.56',
                                    'nvidia-cusparselt-cu13==0.8.0', 'nvidia-nccl-cu13==2.28.9',
                                    'nvidia-nvshmem-cu13==3.4.5']
    assert meta['overrides'] == ['nvidia-cudnn-cu13', 'nvidia-cusparselt-cu13', 'nvidia-nccl-cu13', 'nvidia-nvshmem-cu13']
    assert meta['expect']['torch_version'] == '2.11.0+cu128' and meta['expect']['cudnn_version'] == 91900


def meta_of(name):
    return profiles.load(os.path.join(SHIPPED, name))


def test_every_shipped_profile_is_locked_for_the_pythons_of_the_templates():
    # debian-12-standard's 3.11, ubuntu-24.04-standard's 3.12, debian-13-standard's 3.13
    for directory in LOCKED:
        assert profiles.pythons(profiles.load(directory)) == ['3.11', '3.12', '3.13'], directory


def test_one_lock_for_several_pythons_holds_every_ones_hashes_and_one_set_of_versions():
    head = '# made by uv\n'
    a = head + 'markupsafe==3.0.4 \\\n    --hash=sha256:aa \\\n    --hash=sha256:bb\n    # via jinja2\nsix==1.0 \\\n' \
        '    --hash=sha256:cc\n'
    b = head + 'markupsafe==3.0.4 \\\n    --hash=sha256:dd\n    # via jinja2\nsix==1.0 \\\n    --hash=sha256:cc\n'
    assert profiles.merge({'3.11': a, '3.13': b}) == head + (
        'markupsafe==3.0.4 \\\n    --hash=sha256:aa \\\n    --hash=sha256:bb \\\n    --hash=sha256:dd\n    # via jinja2\n'
        'six==1.0 \\\n    --hash=sha256:cc\n')
    with pytest.raises(ValueError) as e:
        profiles.merge({'3.11': a, '3.13': b.replace('six==1.0', 'six==1.1')})
    assert str(e.value) == ('the resolutions differ by Python (six: 1.0 for Python 3.11, 1.1 for Python 3.13): make one '
                            'profile per Python')


def test_the_default_lock_holds_both_flavours_of_the_shared_libraries():
    pins, problems = profiles.read_lock(os.path.join(SHIPPED, 'default', 'requirements.lock'))
    assert problems == []
    # the cu128 torch wheel of each Python the profile lists (cp311, cp312, cp313), as the PyTorch index names them
    assert pins['torch'][0] == '2.11.0+cu128' and len(pins['torch'][1]) == 3
    assert profiles.pythons(meta_of('default')) == ['3.11', '3.12', '3.13']
    # torch's own cu12 wheels and the cu13 overrides install the same nvidia/<lib>/lib files: both are locked, so
    # the build installs the cu12 ones first and the declared overrides last.
    for lib, cu12 in (('cudnn', '9.19.0.56'), ('cusparselt', '0.7.1'), ('nccl', '2.28.9'), ('nvshmem', '3.4.5')):
        assert pins['nvidia-{0}-cu12'.format(lib)][0] == cu12
        assert 'nvidia-{0}-cu13'.format(lib) in pins


def test_disagreements_are_named(tmp_path):
    d = tmp_path / 'cpu'
    shutil.copytree(os.path.join(SHIPPED, 'cpu'), d)
    text = (d / 'pyproject.toml').read_text()
    (d / 'pyproject.toml').write_text(text.replace('"torch==2.13.0+cpu"', '"torch==2.13.1+cpu", "numpy>=2"'))
    lock = (d / 'requirements.lock').read_text()
    (d / 'requirements.lock').write_text(lock.replace('filelock==4.3.1 \\\n', 'filelock==4.3.1\n', 1).replace(
        '    --hash=sha256:79e43df8e9fe509cd83a3899a7c186c8077cbbe4d200a1ed3705c2f3bb6bc487\n', '', 1))
    (d / 'profile.yml').write_text((d / 'profile.yml').read_text().replace('overrides: []', 'overrides: [nvidia-x]')
                                   .replace('python: ["3.11", "3.12", "3.13"]', 'python: ["3.11", "3.x"]'))
    assert profiles.check(str(d)) == [
        "requirements.lock: 'filelock==4.3.1' is not pinned with == and hashed",
        'torch: pyproject.toml pins 2.13.1+cpu, the lock 2.13.0+cpu',
        "pyproject.toml: 'numpy>=2' is not pinned with ==",
        'profile.yml overrides nvidia-x, which the lock does not hold',
        "profile.yml: python must be Python versions such as \"3.11\" (or a list of them), got ['3.11', '3.x']"]
    (d / 'requirements.lock').unlink()
    assert profiles.check(str(d)) == ['no requirements.lock yet; make it with: gpufleet profile lock {0}'.format(d)]
