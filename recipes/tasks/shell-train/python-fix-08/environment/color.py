print("orange")
