"""The lab's Debian node: which package versions each driver version of a suite installs and pins (pure logic of
gpufleet.lab.host.debnode, without apt)."""

from gpufleet.lab.host.debnode import driver_packages, pinned

FIRST, SECURITY = '535.261.03-1', '535.309.01-0+deb12u1'
OWN = ['libcuda1', 'nvidia-kernel-dkms', 'nvidia-legacy-check', 'nvidia-smi', 'nvidia-suspend-common']


def test_a_package_of_the_source_that_apt_took_at_the_newest_is_installed_at_the_version_asked():
    # `apt-get install -s libcuda1=535.261.03-1 ...` names nvidia-legacy-check unpinned: apt takes the security
    # update's, which a lab node installing 535.261.03-1 from its own repository has not been offered
    needed = {'libcuda1': FIRST, 'nvidia-kernel-dkms': FIRST, 'nvidia-smi': FIRST, 'nvidia-legacy-check': SECURITY,
              'dkms': '3.0.10-8+deb12u1'}
    offered = dict((p, [SECURITY, FIRST]) for p in OWN)
    packages, also = pinned(needed, OWN, offered, FIRST)
    assert packages == {'libcuda1': FIRST, 'nvidia-kernel-dkms': FIRST, 'nvidia-smi': FIRST,
                        'nvidia-legacy-check': FIRST, 'dkms': '3.0.10-8+deb12u1'}
    assert also == {'nvidia-suspend-common': FIRST}  # offered at the version, not needed: pinned by a move
    assert driver_packages(packages, FIRST) == ['libcuda1', 'nvidia-kernel-dkms', 'nvidia-legacy-check', 'nvidia-smi']


def test_a_package_the_archive_does_not_offer_at_the_version_keeps_the_one_apt_chose():
    needed = {'libcuda1': FIRST, 'nvidia-legacy-check': SECURITY}
    offered = {'libcuda1': [FIRST], 'nvidia-legacy-check': [SECURITY]}
    packages, also = pinned(needed, ['libcuda1', 'nvidia-legacy-check'], offered, FIRST)
    assert packages == needed and also == {}
