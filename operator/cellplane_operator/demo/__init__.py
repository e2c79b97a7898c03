"""``cellplane demo``: the local demo of the whole product (the command is
``commands/demo.py``).

``summary`` and ``scene`` are pure (what the demo concludes, what it applies);
``runner`` drives the real processes; ``load`` is the job target and the clients;
``leftovers`` is the record that lets a second demo find the first.
"""
