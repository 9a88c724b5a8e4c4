"""The run explorer: web pages to browse a run, the data behind any step, and who has
verified it (``open1b-audit site`` writes them as a static site, ``open1b-audit serve``
renders them on demand on 127.0.0.1).

``data.py`` gathers each page's content from the run, the mix and a folder of certificates
as plain dicts, calling the library for every answer (chain check, stream windows, batch
statistics, provenance, coverage); ``render.py`` turns a dict into one HTML page;
``static.py`` writes a site; ``serve.py`` is the loopback server; ``assets/`` holds the
one script (curves as inline SVG, static search) and the style sheet, bundled - no page
fetches anything from the network.

Invariants: every value a page shows of a step comes from the hashed part of its log line
(``scalars``, ``components``, ``hash``), except tokens/s, shown as owner-reported; every
string from the corpus or the run's files is HTML-escaped, and JSON embedded in a script
escapes ``<``, ``>``, ``&`` and U+2028/2029, so no document text can run as script. The same
URLs name the same pages in both modes (``index.html``, ``step-N.html`` - and for a step of
more than ``data.PAGE_WINDOWS`` windows ``step-N-windows-K.html`` and ``step-N-stats.html`` -
``doc-S-H-D.html``, ``coverage.html``, ``mix.html``, ``search.html``).
"""
