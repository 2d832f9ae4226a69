"""Root conftest: the plugin's own tests drive pytest in subprocesses through pytester."""

pytest_plugins = ("pytester",)
