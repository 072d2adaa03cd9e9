"""The REST answers of one tree that need no training, as JSON (times masked): a refactor must move none.

    (cd OLD && PYTHONPATH=. python /path/to/tools/rest_answers.py > before.json)
    (cd NEW && PYTHONPATH=. python tools/rest_answers.py > after.json)
    cmp before.json after.json

Each call runs against the real app (`create_app`, under Starlette's TestClient) in a fresh home: the
health and presets routes, the study routes' refusals (unknown ids, invalid specs, a device no node
has) and the OpenAPI document. `tools/ledger_fingerprint.py` checks what training writes."""

import json
import os
import re
import tempfile

os.environ["MEMSWEEP_HOME"] = tempfile.mkdtemp()
os.environ["MEMSWEEP_MLFLOW_TRACKING_URI"] = "file://" + tempfile.mkdtemp()
from fastapi.testclient import TestClient

from service.api import create_app

calls = [
    ("GET", "/health", None),
    ("GET", "/presets", None),
    ("GET", "/presets/orhan2020-copy500", None),
    ("GET", "/presets/nope", None),
    ("GET", "/studies", None),
    ("GET", "/studies?limit=0", None),
    ("GET", "/studies/nope", None),
    ("GET", "/studies/nope/trials", None),
    ("GET", "/studies/nope/best", None),
    ("POST", "/studies", {"preset": "nope"}),
    ("POST", "/studies", {"sampler": "bayes", "colour": 1}),
    ("POST", "/studies", {"space": {"dims": {"lr": []}}}),
    ("POST", "/studies", {"preset": "orhan2020-copy500", "base": {"device": "cuda"}}),
    ("POST", "/studies/nope/extend", {"seeds": [1]}),
    ("POST", "/studies/nope/cancel", None),
    ("GET", "/compare?studies=a&studies=b", None),
    ("GET", "/openapi.json", None),
]
out = []
with TestClient(create_app()) as c:
    for method, path, body in calls:
        r = c.request(method, path, json=body)
        text = re.sub(r'"(created_at|updated_at|time|request_id)": "[^"]*"', r'"\1": "X"', r.text)
        out.append([method, path, r.status_code, text])
print(json.dumps(out, indent=1))
