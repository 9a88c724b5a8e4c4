"""The audit collective: many independent auditors cover a published run together, sharing
nothing but an object-store prefix (docs/AUDIT.md, "The audit collective").

One noun per module: ``source`` (a run URL, read and counted), ``cache`` (what a step needs,
checked against the chain; ``local_run`` for every command), ``windows`` (a step's proved
documents as the replay's loader items), ``publish`` (a run put where auditors read it),
``store`` (conditional creates, never an overwrite), ``event`` (signed ledger entries),
``plan`` (units and relay legs), ``ledger`` (the store's layout and every leg's state),
``claim`` (winning, holding and ending a claim), ``handoff`` (verified end states between
legs), ``leg`` (one leg to its outcome, resumable), ``doctor`` (can this machine take a
leg), ``join`` (the volunteer loop), ``report`` (coverage of the crowd), ``page`` (the
explorer's crowd page) and ``cli`` (the commands).
"""
