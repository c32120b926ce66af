"""The Flower floor: each round, ``floor-down`` bytes to every SuperNode, ``floor-up`` bytes back (no fedhier).

The ServerApp pushes and pulls with the same calls, poll interval and record layout as
``fedhier.runtime.flower`` (a ``bytes`` value in a ``ConfigRecord``); the ClientApp imports
nothing but Flower.  Seconds per round (push to last reply) go to ``floor-out`` as JSON.
"""

import json
import time

from flwr.app import ConfigRecord, Context, Message, RecordDict
from flwr.clientapp import ClientApp
from flwr.serverapp import Grid, ServerApp

server_app = ServerApp()
client_app = ClientApp()


@client_app.train()
def reply(msg: Message, context: Context) -> Message:
    size = int(msg.content.config_records["floor"]["up"])
    return Message(RecordDict({"floor": ConfigRecord({"reply": bytes(size)})}), reply_to=msg)


@server_app.main()
def main(grid: Grid, context: Context) -> None:
    cfg = context.run_config
    rounds, down, up, poll = int(cfg["floor-rounds"]), int(cfg["floor-down"]), int(cfg["floor-up"]), float(cfg["floor-poll"])
    nodes = []
    while len(nodes) < int(cfg["floor-nodes"]):
        nodes = list(grid.get_node_ids())
        time.sleep(1.0)
    seconds = []
    for rnd in range(1, rounds + 1):
        t0 = time.perf_counter()
        content = {"round": rnd, "broadcast": bytes(down), "up": up}
        ids = list(grid.push_messages([
            Message(RecordDict({"floor": ConfigRecord(content)}), dst_node_id=n, message_type="train", group_id=str(rnd), ttl=3600)
            for n in nodes
        ]))
        pending = set(ids)
        while pending:
            for msg in grid.pull_messages(list(pending)):
                pending.discard(msg.metadata.reply_to_message_id)
            if pending:
                time.sleep(poll)
        seconds.append(time.perf_counter() - t0)
    with open(str(cfg["floor-out"]), "w") as fh:
        json.dump(seconds, fh)
