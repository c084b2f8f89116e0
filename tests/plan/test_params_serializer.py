"""`params_serializer`: Snakemake's params strings, without its pandas import while pandas is not
imported. Each check runs in a fresh interpreter, so that pandas' presence is the test's to decide."""
from __future__ import annotations

import json
import os
import subprocess
import sys

from tests.conftest import REPO

VALUES = "[None, 3, 2.5, True, 'text', [1, 'a'], (2, 3), {'k': [1]}, {4}, b'x', object()]"


def run(code: str) -> dict:
    """Run `code` in a fresh interpreter (the repository importable); it prints one JSON object."""
    prelude = ("import json, sys\nfrom snakemake.persistence.file import FilePersistence\n"
               "from pipeline_src.plan.params_serializer import pandas_only_when_imported\n"
               "p = object.__new__(FilePersistence)  # uninitialised: the serializers read no state\n")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    out = subprocess.run([sys.executable, "-c", prelude + code], capture_output=True, text=True, env=env, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_snakemake_itself_imports_pandas_to_serialize_a_plain_param():
    # What the patch is for: without it, one string param costs the pandas import.
    out = run("p._serialize_param('text')\nprint(json.dumps({'pandas': 'pandas' in sys.modules}))")
    assert out == {"pandas": True}


def test_without_pandas_imported_the_strings_are_snakemakes_and_pandas_stays_out():
    out = run(f"values = {VALUES}\n"
              "builtin = [repr(p._serialize_param_builtin(v)) for v in values]\n"
              "assert pandas_only_when_imported() and not pandas_only_when_imported()  # once\n"
              "patched = [repr(p._serialize_param(v)) for v in values]\n"
              "print(json.dumps({'same': patched == builtin, 'pandas': 'pandas' in sys.modules}))")
    assert out == {"same": True, "pandas": False}


def test_once_pandas_is_imported_its_objects_get_snakemakes_pandas_strings():
    out = run("import pandas as pd\n"
              f"values = {VALUES}[:-1] + [pd.DataFrame({{'a': [1, 2]}}), pd.Series([3.0]), pd.Index(['i'])]\n"
              "original = [p._serialize_param_pandas(v) for v in values]\n"
              "pandas_only_when_imported()\n"
              "patched = [p._serialize_param(v) for v in values]\n"
              "print(json.dumps({'same': patched == original, 'hashed': patched[-3] != repr(values[-3])}))")
    assert out == {"same": True, "hashed": True}
