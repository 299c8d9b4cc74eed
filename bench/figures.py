"""Where the benchmarks keep their figures: bench/results/<name>.json, and a table on stdout."""

import json
import os

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'results')


def save(name, figures):
    os.makedirs(RESULTS, exist_ok=True)
    with open(os.path.join(RESULTS, name + '.json'), 'w') as fh:
        json.dump(figures, fh, indent=2, sort_keys=True)
    width = max(len(key) for key in figures) + 2
    for key in sorted(figures):
        print('{0:{1}} {2}'.format(key, width, figures[key]))
