print("cloud")
