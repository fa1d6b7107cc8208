"""Celery beat: the periodic tasks of a Celery application, sent by one beat at a time.

Every host runs the same command; aioelect starts beat on the host that leads
and starts it on another one when that host goes::

    aioelect run --forever -- celery -A celery_beat_app beat --schedule /var/lib/beat/schedule
"""

import os

from celery import Celery

app = Celery("celery_beat_app")
app.conf.broker_url = os.environ.get("CELERY_BROKER_URL", "redis://localhost:6379/0")
if app.conf.broker_url == "filesystem://":  # a broker in a directory, to try this on one machine
    folder = os.environ["CELERY_BROKER_DIR"]
    app.conf.broker_transport_options = {"data_folder_in": folder, "data_folder_out": folder}

app.conf.beat_schedule = {
    "refresh-cache": {"task": "celery_beat_app.refresh_cache", "schedule": 1.0},
    "nightly-report": {"task": "celery_beat_app.nightly_report", "schedule": 24 * 3600.0},
}


@app.task
def refresh_cache() -> None:
    print("cache refreshed")


@app.task
def nightly_report() -> None:
    print("nightly report written")
