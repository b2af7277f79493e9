"""The main job: the ``tooldispatch`` command, plays, the row runner and the run report.

This layer sits on top of the actor system (:mod:`actors`) and the stores (:mod:`stores`);
nothing below it imports it.
"""
