prnt("pepper")
