"""_venv_build's Store on a temporary directory: the active venv, the history, the prune plan, the switch, and a
rollback through deploy (nothing built, so no uv)."""

import json
import os

import pytest

from ansible_collections.gpufleet.proxmox.plugins.module_utils import _venv_build

A, B, C = 'a' * 16, 'b' * 16, 'c' * 16


def venv(store, vid, complete=True, meta=None):
    os.makedirs(store.path(vid))
    if complete:
        with open(os.path.join(store.path(vid), _venv_build.MARKER), 'w') as fh:
            json.dump({'id': vid, 'meta': meta or {}}, fh)


@pytest.fixture
def store(tmp_path):
    return _venv_build.Store(str(tmp_path / 'venvs'), str(tmp_path / 'venv'))


def test_active_is_the_id_the_link_points_at_under_root(store, tmp_path):
    assert store.active() is None
    venv(store, A)
    os.symlink(store.path(A), store.link)
    assert store.active() == A
    os.unlink(store.link)
    os.symlink(str(tmp_path), store.link)
    assert store.active() is None


def test_history_keeps_the_ids_and_drops_anything_else(store):
    assert store.history() == []
    os.makedirs(store.root)
    store.record([A, 3, B])
    assert store.history() == [A, B]
    with open(os.path.join(store.root, 'history.json'), 'w') as fh:
        fh.write('{"not": "a list"}')
    assert store.history() == []


def test_complete_is_the_marker(store):
    venv(store, A)
    venv(store, B, complete=False)
    assert store.complete(A) and not store.complete(B) and not store.complete(C)
    assert store.marker(A)['id'] == A and store.marker(B) is None


def test_check_link_refuses_a_real_directory_or_file(store, tmp_path):
    store.check_link()
    os.makedirs(store.link)
    with pytest.raises(ValueError, match='is a real directory'):
        store.check_link()
    os.rmdir(store.link)
    open(store.link, 'w').close()
    with pytest.raises(ValueError, match='is a real file'):
        store.check_link()
    os.unlink(store.link)
    os.symlink(str(tmp_path), store.link)
    store.check_link()


def test_kept_and_plan_prune(store):
    assert store.plan_prune([A]) == []
    venv(store, A)
    venv(store, B)
    venv(store, C, complete=False)  # an unfinished build
    os.makedirs(os.path.join(store.root, 'not-a-venv'))
    assert store.kept([A, C, B, A], B, 1) == [B, A]
    assert store.kept([A, B], B, 0) == [B]
    assert store.plan_prune([B, A]) == [C]
    assert store.plan_prune([B]) == [A, C]


def test_switch_record_and_remove(store):
    venv(store, A)
    venv(store, B)
    with store.locked():
        store.switch(A)
        store.switch(B)
        store.record([A, B])
        store.remove([A])
    assert os.readlink(store.link) == store.path(B) and store.active() == B
    assert store.history() == [A, B]
    assert not os.path.exists(store.path(A))
    assert os.path.exists(os.path.join(store.root, '.lock'))


def test_locked_makes_root(store):
    with store.locked():
        assert os.path.isdir(store.root)


def test_a_failed_build_removes_the_venv_and_its_unfinished_predecessor(store, tmp_path):
    venv(store, A, complete=False)
    req = _venv_build.Request(root=store.root, link=store.link, uv=str(tmp_path / 'no-uv'))
    with pytest.raises(_venv_build.BuildError, match='uv venv could not run'):
        store.build(A, req, lock_text='x==1 --hash=sha256:00\n', env=None)
    assert not os.path.exists(store.path(A))


def test_a_failed_repair_step_is_a_repair_error(store, tmp_path):
    req = _venv_build.Request(root=store.root, link=store.link)
    with pytest.raises(_venv_build.RepairError, match='the repair step'):
        store.mend([[str(tmp_path / 'no-such-command')]], req, lock=None, env=None)


@pytest.mark.parametrize('check', [False, True])
def test_deploy_rolls_back_to_the_previous_venv(store, check):
    venv(store, A, meta={'profile': 'old'})
    venv(store, B)
    os.symlink(store.path(B), store.link)
    store.record([A, B])
    result = _venv_build.deploy(_venv_build.Request(root=store.root, link=store.link, rollback=True, check=check))
    assert result == {
        'changed': True, 'built': False, 'switched': True, 'previous': B, 'removed': [], 'timings': {},
        'link': store.link, 'id': A, 'venv': store.path(A), 'meta': {'profile': 'old'}, 'uv_installed': False,
        'lock_written': False}
    assert store.active() == (B if check else A)
    assert store.history() == ([A, B] if check else [B, A])


def test_deploy_refuses_a_rollback_with_nothing_to_go_back_to(store):
    venv(store, A)
    os.symlink(store.path(A), store.link)
    with pytest.raises(ValueError, match='no previous venv'):
        _venv_build.deploy(_venv_build.Request(root=store.root, link=store.link, rollback=True))
