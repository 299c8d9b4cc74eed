"""The venv audit on a venv laid out here as an installer leaves one (tests/unit/fixtures.py: a real venv of this
Python, distributions with their RECORD, ELF libraries with their DT_NEEDED): each way the seed incident's "cleaning"
broke torch's venv is found, named, and keeps the venv from being called healthy."""

import os

from ansible_collections.gpufleet.proxmox.plugins.module_utils import _venv

from fixtures import elf, install, torch_like_venv

LIBRARY = 'nvidia/cudnnx/lib/libcudnnx.so.9'


def findings(audit):
    return dict((k, v) for k, v in audit['findings'].items() if v and (k != 'drift' or any(v.values())))


def test_a_venv_as_its_installer_left_it_is_healthy(tmp_path):
    venv, _site = torch_like_venv(tmp_path / 'venv')
    for mode in ('fast', 'full'):
        audit = _venv.audit(venv, mode=mode)
        assert findings(audit) == {} and audit['healthy'] is True and audit['distributions'] == 2, mode
        assert audit['optional_libraries'] == [] and audit['plan'] == []


def test_a_shared_library_that_no_distribution_lists_and_an_extension_needs_is_unresolved(tmp_path):
    # the seed's first break: a library gone that nothing's RECORD names (no RECORD finding can see it)
    venv, site = torch_like_venv(tmp_path / 'venv')
    install(site, 'extra', '1.0', {'extra/_ext.so': elf(needed=['libgone.so.3'], module='_ext')})
    audit = _venv.audit(venv)
    assert audit['healthy'] is False
    assert audit['findings']['unresolved_libraries'] == [
        {'soname': 'libgone.so.3', 'needed_by': ['extra/_ext.so'], 'provided_by': [], 'in_lock': []}]


def test_a_library_its_distribution_lists_but_lost_is_unresolved_and_its_distribution_broken(tmp_path):
    venv, site = torch_like_venv(tmp_path / 'venv')
    os.remove(os.path.join(site, LIBRARY))
    audit = _venv.audit(venv)
    assert audit['healthy'] is False
    assert audit['findings']['unresolved_libraries'] == [
        {'soname': 'libcudnnx.so.9', 'needed_by': ['torchlike/_C.so'], 'provided_by': ['nvidia-cudnnx'], 'in_lock': []}]
    assert audit['findings']['broken_distributions'] == [
        {'name': 'nvidia-cudnnx', 'version': '9.19.0', 'missing': [LIBRARY], 'modified': []}]
    assert ['uv', 'pip', 'install'] == audit['plan'][-1][:3] and 'nvidia-cudnnx==9.19.0' in audit['plan'][-1]


def test_a_hollow_dist_info_whose_files_are_gone_is_a_broken_distribution(tmp_path):
    # the dist-info stays (pip list shows it, import metadata finds it), its package does not
    venv, site = torch_like_venv(tmp_path / 'venv')
    for rel in ('torchlike/__init__.py', 'torchlike/_C.so'):
        os.remove(os.path.join(site, rel))
    os.rmdir(os.path.join(site, 'torchlike'))
    audit = _venv.audit(venv)
    assert audit['healthy'] is False
    assert audit['findings']['broken_distributions'] == [
        {'name': 'torchlike', 'version': '2.11.0', 'missing': ['torchlike/_C.so', 'torchlike/__init__.py'],
         'modified': []}]


def test_a_file_whose_size_is_not_its_records_is_modified_in_both_modes(tmp_path):
    venv, site = torch_like_venv(tmp_path / 'venv')
    with open(os.path.join(site, 'torchlike', '__init__.py'), 'ab') as fh:
        fh.write(b'# an edit\n')
    for mode in ('fast', 'full'):
        audit = _venv.audit(venv, mode=mode)
        assert audit['healthy'] is False, mode
        assert audit['findings']['broken_distributions'] == [
            {'name': 'torchlike', 'version': '2.11.0', 'missing': [], 'modified': ['torchlike/__init__.py']}], mode


def test_a_file_of_its_records_size_but_other_bytes_is_modified_in_full_mode(tmp_path):
    venv, site = torch_like_venv(tmp_path / 'venv')
    path = os.path.join(site, 'torchlike', '__init__.py')
    with open(path, 'rb') as fh:
        data = fh.read()
    with open(path, 'wb') as fh:
        fh.write(data[::-1])  # the same size: fast mode, which compares sizes, cannot see it
    assert _venv.audit(venv, mode='fast')['healthy'] is True
    full = _venv.audit(venv, mode='full')
    assert full['healthy'] is False
    assert full['findings']['broken_distributions'] == [
        {'name': 'torchlike', 'version': '2.11.0', 'missing': [], 'modified': ['torchlike/__init__.py']}]


def test_two_distributions_claiming_one_file_with_other_bytes_is_a_collision_that_names_both(tmp_path):
    venv, site = torch_like_venv(tmp_path / 'venv')
    install(site, 'nvidia-cudnnx-dev', '9.19.0', {'nvidia/cudnnx/include/cudnn.h': b'/* dev */\n'})
    install(site, 'other-cudnn', '9.1.0', {'nvidia/cudnnx/include/cudnn.h': b'/* older, longer */\n'})
    audit = _venv.audit(venv)
    assert audit['healthy'] is False
    collisions = audit['findings']['collisions']
    assert [(c['path'], c['claimed_by'], c['on_disk']) for c in collisions] == [
        ('nvidia/cudnnx/include/cudnn.h', ['nvidia-cudnnx-dev', 'other-cudnn'], 'other-cudnn')]
    assert 'decide' in collisions[0]  # nothing decides between them: the finding says what to declare


def test_two_distributions_claiming_one_file_with_the_same_bytes_share_it(tmp_path):
    venv, site = torch_like_venv(tmp_path / 'venv')
    for name in ('ns-a', 'ns-b'):
        install(site, name, '1.0', {'nsroot/__init__.py': b'# namespace\n', name.replace('-', '_') + '.py': b''})
    audit = _venv.audit(venv)
    assert audit['healthy'] is True and audit['findings']['collisions'] == []
    assert audit['shared_files'] == [{'path': 'nsroot/__init__.py', 'claimed_by': ['ns-a', 'ns-b']}]


def test_a_dist_info_without_its_record_is_a_broken_distribution(tmp_path):
    venv, site = torch_like_venv(tmp_path / 'venv')
    os.remove(os.path.join(site, 'nvidia_cudnnx-9.19.0.dist-info', 'RECORD'))
    audit = _venv.audit(venv)
    assert audit['healthy'] is False
    assert audit['findings']['broken_distributions'] == [
        {'name': 'nvidia-cudnnx', 'version': '9.19.0', 'missing': ['nvidia_cudnnx-9.19.0.dist-info/RECORD'],
         'modified': []}]
    assert audit['plan'] == [['rm', '-rf', '--', os.path.join(site, 'nvidia_cudnnx-9.19.0.dist-info')],
                             ['uv', 'pip', 'install', '--python', os.path.join(venv, 'bin', 'python'), '--no-deps',
                              'nvidia-cudnnx==9.19.0']]
