"""Reports: PNG figures and one self-contained offline HTML page with the chapter's interactive experiments."""
