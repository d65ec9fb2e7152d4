print("river")
