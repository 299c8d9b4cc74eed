"""Files the CLI writes for others to read (the metrics for node_exporter, the fleet's page)."""

import os


def publish(path, text):
    """Write text to path whole: a temporary file in the same directory (hidden, and not *.prom, so that
    node_exporter's textfile collector never reads it half written), flushed to disk, made readable by all (0644:
    the collector and a web server run as other users), then renamed over path. Returns path."""
    directory = os.path.dirname(os.path.abspath(path))
    part = os.path.join(directory, '.{0}.{1}.tmp'.format(os.path.basename(path), os.getpid()))
    try:
        with open(part, 'w') as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(part, 0o644)
        os.replace(part, path)
    finally:
        if os.path.exists(part):
            os.unlink(part)
    return path
