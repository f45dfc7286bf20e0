"""The course layer: what the lessons share, the accept-rule grader, the figures and the rendered site.

  models.py  the models lessons run on, chosen for the device (the embedded pair, or a GPU's)
  grader.py  grades an accept rule a student writes: a statistical test and a probe per bug class
  plots.py   the matplotlib figures (and sliders) the lessons and the command line share
  site.py    runs every lesson once and renders the static course site
"""
