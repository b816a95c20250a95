"""django_pgjobs' reference, generated from its code.

One module per page writes its Markdown (`settings`, `commands`, `checks`, `signals`,
`exceptions`, `states`, `rules`; `samples`: commands' output for the how-to pages) and
imports no Sphinx, so the test suite checks what the pages say without building the site;
`directives` is the Sphinx extension that puts each in its page (`{pgjobs-settings}` ...).
"""
