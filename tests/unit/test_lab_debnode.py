"""The lab's Debian node: which package versions each driver version of a suite installs and offers (pure logic of
gpufleet.lab.host.debnode, without apt)."""

from gpufleet.lab.host.debnode import also_offered, driver_packages

FIRST, SECURITY = '535.261.03-1', '535.309.01-0+deb12u1'
OWN = ['libcuda1', 'nvidia-kernel-dkms', 'nvidia-legacy-check', 'nvidia-smi', 'nvidia-suspend-common']


def test_a_package_apt_took_at_another_version_is_offered_at_this_one_too():
    # `apt-get install -s libcuda1=535.261.03-1 ...` takes nvidia-legacy-check, which it is not asked for by
    # version, at the security update's: a real node installed so has it there, and a move pins it at its version
    needed = {'libcuda1': FIRST, 'nvidia-kernel-dkms': FIRST, 'nvidia-smi': FIRST, 'nvidia-legacy-check': SECURITY,
              'dkms': '3.0.10-8+deb12u1'}
    offered = dict((p, [SECURITY, FIRST]) for p in OWN)
    assert also_offered(needed, OWN, offered, FIRST) == {'nvidia-legacy-check': FIRST, 'nvidia-suspend-common': FIRST}
    # what the node installs pinned: the source's packages apt took at the version (legacy-check as apt chooses)
    assert driver_packages(needed, FIRST) == ['libcuda1', 'nvidia-kernel-dkms', 'nvidia-smi']


def test_a_package_the_archive_does_not_offer_at_the_version_is_not_pinned_there():
    needed = {'libcuda1': FIRST, 'nvidia-legacy-check': SECURITY}
    offered = {'libcuda1': [FIRST], 'nvidia-legacy-check': [SECURITY]}
    assert also_offered(needed, ['libcuda1', 'nvidia-legacy-check'], offered, FIRST) == {}
