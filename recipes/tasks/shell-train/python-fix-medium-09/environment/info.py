prnt("lemon")
