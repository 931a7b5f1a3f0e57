"""``toolexec ui``: each agent run's calls on a timeline, and the live fleet, in a browser.

:mod:`toolexec.ui.runs` reads the run log (:mod:`wire.runlog`); :mod:`toolexec.ui.app`
serves the pages and their JSON API (Starlette, Jinja2 templates, no build step: the
pages refresh their live parts with a few lines of their own script).
"""
