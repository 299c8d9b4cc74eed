"""Unit tests import the collection's module_utils from the checkout (.collections links back to it)."""

import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, '.collections'))
