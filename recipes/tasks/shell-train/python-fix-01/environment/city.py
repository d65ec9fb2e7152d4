print("rocket")
