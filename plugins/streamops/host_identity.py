"""Which host this process is, for Airflow's task records and the drivers it launches.

On a real cluster every Airflow worker is its own machine and the host name says which. The
cluster profile on one machine gives each Celery worker a loopback address of its own
(STREAMOPS_HOST_ADDRESS); Airflow records that as the task's hostname (`hostname_callable`), and the
drivers a worker launches bind to it (SPARK_LOCAL_IP), so "which worker ran this" stays answerable.
"""

from __future__ import annotations

import socket

from streamops import settings


def host_address() -> str:
    """This host's name as Airflow records it: the address the profile gave it, else the FQDN."""
    return settings.HOST_ADDRESS.get() or socket.getfqdn()
