"""The explorer's crowd page (``crowd.html``): the store's legs, claims in flight, expired
claims, disputes, refused hand-offs and distrusted keys - the ``crowd`` section of the
coverage report (``report.py``), rendered with the explorer's page frame; every string
escaped (``site.render.e``), as on every other page."""
from __future__ import annotations

import os
from typing import Any

from open1b.safeio import write_atomic


def crowd_html(rep: dict[str, Any]) -> str:
    from open1b_audit.site.render import e, page, table

    c = rep["crowd"]
    p = c["plan"]
    head = (f"<p>Store <code>{e(c['store'])}</code>: {e(c['legs_covered'])} of "
            f"{e(len(c['legs']))} legs certified by {e(p['redundancy'])} distinct key(s); legs "
            f"of at most {e(p['leg_steps'])} steps, lease {e(round(p['lease_s']))} s. Steps "
            f"covered (coverage page): {e(rep.get('covered'))} of {e(rep.get('steps'))}.</p>")
    legs = table([(x["leg"], f"{x['steps'][0]}..{x['steps'][1]}", x["certified_by"],
                   "yes" if x["covered"] else "no",
                   ", ".join(f"s{s['slot']}g{s['gen']} {str(s['key'])[:16]} {s['status']}"
                             for s in x["claims"]) or "-") for x in c["legs"]],
                 ("leg", "steps", "certified by", "covered", "claims"))
    parts = [head, "<h2>Legs</h2>", legs]
    for title, rows, cols in (
            ("In flight", [(x["leg"], x["slot"], str(x["key"])[:16]) for x in c["in_flight"]],
             ("leg", "slot", "key")),
            ("Expired claims", [(x["leg"], x["slot"], str(x["key"])[:16])
                                for x in c["expired"]], ("leg", "slot", "key")),
            ("Disputes", [(d["leg"], d["key"][:16], (d.get("finding") or {}).get("step"),
                           (d.get("finding") or {}).get("component"),
                           (d.get("finding") or {}).get("detail")) for d in c["disputes"]],
             ("leg", "key", "step", "component", "detail")),
            ("Refused hand-offs", [(r["step"], r["sender"][:16], r["refuser"][:16],
                                    "confirmed" if r["confirmed"] else "not confirmed",
                                    r["why"]) for r in c["refusals"]],
             ("step", "sender", "refused by", "re-checked", "why")),
            ("Distrusted keys", [(k[:16], "; ".join(v)) for k, v in c["distrusted"].items()],
             ("key", "why none of its certificates counts"))):
        parts.append(f"<h2>{e(title)}</h2>" + (table(rows, cols) if rows else "<p>none</p>"))
    return page("Crowd", "".join(parts))


def write_crowd_page(rep: dict[str, Any], out: str) -> str:
    path = os.path.join(out, "crowd.html")
    write_atomic(path, crowd_html(rep).encode("utf-8"), fsync=False)
    return path
