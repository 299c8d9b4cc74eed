"""`gpufleet report`'s page, read back as HTML: each node's GPUs and who holds them (shared, free, a holder that is
missing, stopped or failed), each container's state, versions, GPUs (or CPU only) and drift, nothing fetched from
elsewhere, every text escaped; and which run's result it takes. A real browser renders it in
tests/integration/test_cli.py."""

import json
import os
from html.parser import HTMLParser

from gpufleet.cli import report

EXAMPLE = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'data', 'report-example.json')


class Page(HTMLParser):
    """The page's GPU cells ({(node, index): attributes and text}), container rows ({host: cell texts}) and text."""

    def __init__(self):
        super().__init__()
        self.node, self.gpus, self.rows, self.text, self.tags = None, {}, {}, [], []
        self._gpu = self._row = self._cell = None
        self._depth = 0  # open divs inside the GPU cell being read

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        self.tags.append((tag, attrs))
        if tag == 'div' and self._gpu is not None:
            self._depth += 1
        if tag == 'section':
            self.node = attrs['data-node']
        elif 'data-gpu' in attrs:
            self._gpu, self._depth = dict(attrs, text=[]), 0
            self.gpus[(self.node, int(attrs['data-gpu']))] = self._gpu
        elif tag == 'tr' and 'data-host' in attrs:
            self._row = self.rows[attrs['data-host']] = []
        elif tag == 'td' and self._row is not None:
            self._cell = []
            self._row.append(self._cell)

    def handle_endtag(self, tag):
        if tag in ('td', 'tr'):
            self._cell = None
        if tag == 'tr':
            self._row = None
        if tag == 'div' and self._gpu is not None:
            if self._depth == 0:
                self._gpu['text'] = ' '.join(self._gpu['text'])
                self._gpu = None
            else:
                self._depth -= 1

    def handle_data(self, data):
        self.text.append(data)
        if self._cell is not None:
            self._cell.append(data)
        if self._gpu is not None:
            self._gpu['text'].append(data)


def parsed(result):
    page = Page()
    page.feed(report.page(result))
    return page


def example():
    with open(EXAMPLE) as fh:
        return json.load(fh)


def test_each_gpu_shows_who_holds_it():
    page = parsed(example())
    gpus = page.gpus
    assert sorted(k for k in gpus if k[0] == 'gpu01') == [('gpu01', i) for i in range(8)]
    assert gpus[('gpu01', 0)]['data-holders'] == 'train-0' and 'background:#' in gpus[('gpu01', 0)]['style']
    shared = gpus[('gpu01', 6)]
    assert shared['data-holders'] == 'nb-a nb-b' and 'linear-gradient' in shared['style']
    assert 'shared: nb-a, nb-b' in shared['text'] and '78:00.0' in shared['text']  # the bus id, domain 0 left out
    assert gpus[('gpu01', 7)]['class'] == 'gpu free' and 'free' in gpus[('gpu01', 7)]['text']
    assert gpus[('gpu01', 4)]['class'] == 'gpu failed'  # its holder runs and was not verified
    assert 'train-2 (CT 201, missing)' in gpus[('gpu02', 0)]['text'] and 'opacity:.5' in gpus[('gpu02', 0)]['style']
    assert 'train-3 (CT 202, stopped)' in gpus[('gpu02', 2)]['text']
    assert not [k for k in gpus if k[0] == 'util01']  # a CPU node has no grid


def test_each_container_with_its_state_versions_gpus_and_drift():
    page = parsed(example())
    rows = dict((host, [''.join(c).strip() for c in cells]) for host, cells in page.rows.items())
    assert sorted(rows) == ['nb-a', 'nb-b', 'train-0', 'train-1', 'train-2', 'train-3', 'util-0']
    assert rows['train-0'][:7] == ['train-0', '101', 'verified', '2.11.0+cu128', '12.8', '580.95.05',
                                   '0, 1, 2, 3 (torch saw 4)']
    assert rows['train-0'][7] == 'allreduce, cudnn_conv, cusparselt_24 n/a, shm (all_reduce 141.2 GB/s) (20112.5 ' \
        'tokens/s, 99% of its baseline)'
    assert rows['train-1'][2] == 'failed' and 'libcudnn.so.9' in rows['train-1'][8]
    assert rows['train-1'][7] == 'allreduce, cudnn_conv'
    assert rows['train-1'][9] == 'venv nvidia-cudnn-cu13: missing: 9.19.0.56 is in the lock'
    assert (rows['train-2'][2], rows['train-3'][2]) == ('missing', 'stopped')
    assert rows['util-0'][6] == 'CPU only'
    text = ''.join(page.text)
    assert 'no NVIDIA driver loaded, no GPU' in text and 'NVIDIA driver 570.172.08, 4 GPU(s)' in text
    assert 'node driver: 570.172.08 is loaded; the fleet asks for 580.95.05' in text
    assert 'gpufleet drift, ended 2026-12-05 05:53:20 UTC, exit code 2' in text


def test_the_page_fetches_nothing_and_escapes_every_text():
    hostile = example()
    hostile['verdict'] = '<script>alert(1)</script>'
    hostile['containers'][0]['host'] = 'a"><img src=x onerror=alert(1)>'
    text = report.page(hostile)
    assert '<script>' not in text and '<img' not in text and '&lt;script&gt;' in text
    page = parsed(hostile)
    # no element loads anything: no src, href, link, import or url()
    assert not [t for t, attrs in page.tags if t in ('script', 'img', 'link', 'iframe') or 'src' in attrs or
                'href' in attrs]
    assert '@import' not in text and 'url(' not in text and 'http' not in text


def test_the_report_takes_the_newest_run_with_a_result(tmp_path):
    assert report.last_result(str(tmp_path)) is None
    for name, result, mtime in (('a-verify', {'verdict': 'older'}, 100), ('b-drift', {'verdict': 'newer'}, 200),
                                ('c-doctor', {'verdict': 'ready', 'checks': []}, 300)):
        run = tmp_path / 'artifacts' / name
        run.mkdir(parents=True)
        (run / 'result.json').write_text(json.dumps(result))
        os.utime(str(run / 'result.json'), (mtime, mtime))
    (tmp_path / 'artifacts' / 'd-broken').mkdir()
    (tmp_path / 'artifacts' / 'd-broken' / 'result.json').write_text('{')
    assert report.last_result(str(tmp_path))['verdict'] == 'newer'  # the doctor's has no fleet to show
