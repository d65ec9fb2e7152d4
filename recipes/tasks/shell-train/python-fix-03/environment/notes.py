print("tiger")
