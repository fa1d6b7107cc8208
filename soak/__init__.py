"""The nemesis soak: candidates writing to a fenced register while faults are injected, then a checker.

Run it with ``make soak`` (``python -m soak --minutes M --seed S``); see
docs/soak.md. One module per job:

* :mod:`.timing` -- the elector options of each backend and the bounds the checker holds them to;
* :mod:`.candidate` -- a candidate process (``aioelect`` ``run()``, leader work = fenced writes);
* :mod:`.register` -- the fenced register on a PostgreSQL server that no fault touches;
* :mod:`.targets` -- the servers under test, their proxies, and the faults done on the server side;
* :mod:`.nemesis` -- the seeded fault schedule and its execution (every fault healed);
* :mod:`.runner` -- one backend's run: servers, candidates, nemesis, clean shutdown, leftovers;
* :mod:`.checker` -- judges a recorded history; knows nothing of processes or servers;
* :mod:`.report` -- text timeline, SVG picture, markdown report.

Nothing here ships in the wheel (pyproject packages only ``aioelect*``).
"""
