"""Reads ablate's TensorBoard event files with TensorBoard's own code and prints what a user would see.

Usage: tensorboard_read.py LOGDIR  (with PyPI's `tensorboard` on PYTHONPATH)
Prints JSON: {"scalars": {run: {tag: [[step, value], ...]}}, "experiment": {...}, "session_groups": [...],
"texts": {tag: text}}. Scalars come from the event accumulator (which checks every record's CRC); the experiment
and session groups from the HParams plugin's own HTTP handlers, i.e. what its tab shows; the texts of the
top-level run from the text plugin's own handler (the markdown it renders in the TEXT tab).
"""
import json
import sys

from tensorboard.backend.event_processing import data_provider
from tensorboard.backend.event_processing import plugin_event_multiplexer
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tensorboard.plugins import base_plugin
from tensorboard.plugins.hparams import hparams_plugin
from tensorboard.plugins.text import text_plugin
from werkzeug import test as werkzeug_test
from werkzeug.wrappers import Response


def main(logdir):
    multiplexer = plugin_event_multiplexer.EventMultiplexer()
    multiplexer.AddRunsFromDirectory(logdir)
    multiplexer.Reload()
    scalars = {}
    for run, path in multiplexer.RunPaths().items():
        if run == ".":
            continue
        accumulator = EventAccumulator(path, size_guidance={"scalars": 0})
        accumulator.Reload()
        scalars[run] = {
            tag: [[e.step, e.value] for e in accumulator.Scalars(tag)]
            for tag in accumulator.Tags()["scalars"]
        }
    provider = data_provider.MultiplexerDataProvider(multiplexer, logdir)
    context = base_plugin.TBContext(logdir=logdir, data_provider=provider, multiplexer=multiplexer)
    apps = hparams_plugin.HParamsPlugin(context).get_plugin_apps()

    def post(route, body):
        client = werkzeug_test.Client(apps[route], Response)
        reply = client.post(route, data=json.dumps(body), content_type="application/json")
        if reply.status_code != 200:
            raise SystemExit(f"{route}: HTTP {reply.status_code}: {reply.get_data(as_text=True)}")
        return json.loads(reply.get_data(as_text=True))

    experiment = post("/experiment", {"experimentName": ""})
    groups = post(
        "/session_groups",
        {
            "experimentName": "",
            "allowedStatuses": ["STATUS_SUCCESS", "STATUS_FAILURE", "STATUS_RUNNING", "STATUS_UNKNOWN"],
            "colParams": [],
            "startIndex": 0,
            "sliceSize": 1000,
        },
    )
    texts = {}
    text_apps = text_plugin.TextPlugin(context).get_plugin_apps()
    tags = json.loads(werkzeug_test.Client(text_apps["/tags"], Response).get("/tags").get_data(as_text=True))
    for tag in tags.get(".", []):
        reply = werkzeug_test.Client(text_apps["/text"], Response).get("/text", query_string={"run": ".", "tag": tag})
        texts[tag] = json.loads(reply.get_data(as_text=True))[-1]["text"]
    print(json.dumps({"scalars": scalars, "experiment": experiment, "session_groups": groups.get("sessionGroups", []), "texts": texts}))


if __name__ == "__main__":
    main(sys.argv[1])
