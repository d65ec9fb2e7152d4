print("garden")
