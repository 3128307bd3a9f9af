"""A scholar's collection: the folder reader, the index, the search, the decisions on candidate joins and the workbench that serves them."""
