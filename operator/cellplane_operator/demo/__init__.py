"""``cellplane demo``: the local demo of the whole product (see ``command``).

``summary`` and ``scene`` are pure (what the demo concludes, what it applies);
``runner`` drives the real processes; ``load`` is the job target and the clients;
``leftovers`` is the record that lets a second demo find the first.
"""

from cellplane_operator.demo.command import add_demo_command, run_demo, stop_demo

__all__ = ["add_demo_command", "run_demo", "stop_demo"]
