"""Views of a stored run for people: the HTML report and the data behind `show` and `diff`."""
