"""Every Python process the tests start runs this at start-up (tests/conftest.py puts this folder on PYTHONPATH):
the network guard of offline_guard.py, so a subprocess cannot leave the machine either."""
import offline_guard

offline_guard.install()
